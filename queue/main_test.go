package queue

import (
	"os"
	"testing"

	"github.com/diskque/diskque/internal/leakcheck"
)

// TestMain fails the package's tests if any of them leaves a goroutine
// running (a store, broker or collector not closed, or whose Close returned
// before its goroutines did).
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
