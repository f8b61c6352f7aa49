package durable

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestMkdirAllSurvivesCrash(t *testing.T) {
	fs := vfs.NewCrashableMem()
	if err := MkdirAll(fs, "a/b/c"); err != nil {
		t.Fatal(err)
	}
	f, err := fs.Create("a/b/c/f", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := SyncDir(fs, "a/b/c"); err != nil {
		t.Fatal(err)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	st, err := crashed.Stat("a/b/c/f")
	if err != nil || st.Size() != 4 {
		t.Fatalf("file lost in the crash: %v", err)
	}
	// Plain MkdirAll is not enough: the clone loses the directory.
	fs2 := vfs.NewCrashableMem()
	if err := fs2.MkdirAll("x/y", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := fs2.CrashClone(vfs.CrashCloneCfg{}).Stat("x/y"); err == nil {
		t.Fatal("an unsynced directory survived the crash; the test proves nothing")
	}
	// An existing directory is left alone.
	if err := MkdirAll(fs, "a/b/c"); err != nil {
		t.Fatal(err)
	}
}
