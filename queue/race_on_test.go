//go:build race

package queue

// raceEnabled: the race detector slows the store's index tenfold and more,
// so the heaviest tests scale down under it.
const raceEnabled = true
