//go:build race

package main

// raceEnabled: the test binary runs under the race detector, so the server
// binary is built with -race too.
const raceEnabled = true
