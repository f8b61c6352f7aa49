//go:build cgo && linux

package main

/*
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

// diskque_malloc_arenas caps glibc's malloc arenas before any thread but
// the first exists: a C constructor runs at load, before the Go runtime
// starts its threads. Pebble allocates its block cache and memtables with
// C malloc (cgo builds), and glibc gives each thread that contends for
// the main arena an arena of its own (up to 8 per core): freed cache
// blocks then sit in 7 arenas, 125 MB resident on a clustered origin
// against a 96 MiB Pebble budget (bench/README.md). MALLOC_ARENA_MAX in
// the environment wins.
static int diskque_arenas_set;

__attribute__((constructor)) static void diskque_malloc_arenas(void) {
#if defined(__GLIBC__) && defined(M_ARENA_MAX)
	if (getenv("MALLOC_ARENA_MAX") != NULL) {
		return;
	}
	if (mallopt(M_ARENA_MAX, 2) == 1) {
		diskque_arenas_set = 2;
	}
#endif
}

static int diskque_malloc_trim(void) {
#ifdef __GLIBC__
	return malloc_trim(0);
#else
	return -1;
#endif
}

static int diskque_arenas(void) { return diskque_arenas_set; }
*/
import "C"

// mallocArenas is the glibc arena cap set at load (0: none set, another
// libc, or MALLOC_ARENA_MAX in the environment).
func mallocArenas() int { return int(C.diskque_arenas()) }

// mallocTrim gives the C heap's free pages back to the kernel
// (malloc_trim(0): every arena, not only the top of each). It reports
// whether the libc has it.
func mallocTrim() bool { return C.diskque_malloc_trim() >= 0 }
