//go:build cgo

package main

// pebbleInGoHeap: with cgo Pebble allocates its block cache and memtables
// with C malloc, outside the Go heap and its memory limit.
const pebbleInGoHeap = false
