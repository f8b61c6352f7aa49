package durable

import (
	"os"
	"path/filepath"
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

// WriteFile replaces the file whole, leaves no temporary file behind, and
// sets the permissions asked for.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	for _, data := range []string{"first", "second, longer"} {
		if err := WriteFile(vfs.Default, path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != data {
			t.Fatalf("read %q, %v: want %q", got, err, data)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v: want 0600", fi.Mode(), err)
	}
	if _, err := os.Stat(path + TmpSuffix); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
	// A rename that fails removes the temporary file.
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "d", "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(vfs.Default, filepath.Join(dir, "d"), []byte("x"), 0); err == nil {
		t.Fatal("rename over a non-empty directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "d") + TmpSuffix); !os.IsNotExist(err) {
		t.Errorf("temporary file left after a failure: %v", err)
	}
}
