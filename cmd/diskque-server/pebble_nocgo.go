//go:build !cgo

package main

// pebbleInGoHeap: without cgo Pebble's block cache and memtables are Go
// slices, counted by the Go memory limit.
const pebbleInGoHeap = true
