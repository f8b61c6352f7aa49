// Package cputime reads the process's CPU time, for benchmarks that report
// CPU per operation: on machines whose cores the load generator and the
// background work (Pebble's flushes and compactions) share, CPU per
// operation varies far less from run to run than operations per second.
package cputime

import (
	"syscall"
	"time"
)

// Used returns the user and system CPU time the process has used so far,
// on every thread; 0 if the system cannot tell.
func Used() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
