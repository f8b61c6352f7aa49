//go:build !race && !diskque_invariants

package storage

// invariants turns on checks too dear for production that catch a wrong
// write into the index where it happens rather than as a job that comes
// back later (see writeBuffer.Delete). On in race builds (every test run of
// `make test`) and with the diskque_invariants build tag.
const invariants = false
