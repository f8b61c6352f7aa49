//go:build !cgo || !linux

package main

// Without cgo Pebble allocates in the Go heap, under the Go memory limit:
// there is no C heap to shape.
func mallocArenas() int { return 0 }
func mallocTrim() bool  { return false }
