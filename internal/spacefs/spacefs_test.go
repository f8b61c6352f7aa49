package spacefs

import (
	"errors"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestLimit: writes are charged until the limit, the one past it fails with
// ENOSPC and writes nothing, and removing or replacing files gives room back.
func TestLimit(t *testing.T) {
	dir := t.TempDir()
	f := New(vfs.Default, 100)
	a, err := f.Create(dir+"/a", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(make([]byte, 60)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt(make([]byte, 10), 20); err != nil { // inside: no growth
		t.Fatal(err)
	}
	if got := f.Used(); got != 60 {
		t.Fatalf("Used %d after 60 bytes, want 60", got)
	}
	if _, err := a.Write(make([]byte, 41)); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a write past the limit: %v, want ENOSPC", err)
	}
	if st, _ := a.Stat(); st.Size() != 60 || f.Refused() != 1 {
		t.Fatalf("size %d, refused %d after the refused write; want 60, 1", st.Size(), f.Refused())
	}
	if u, _ := f.GetDiskUsage(dir); u.AvailBytes != 40 || u.TotalBytes != 100 {
		t.Fatalf("disk usage %+v, want 40 of 100 free", u)
	}
	a.Close()
	b, err := f.Create(dir+"/b", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write(make([]byte, 30)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := f.Rename(dir+"/b", dir+"/a"); err != nil { // replaces a's 60 bytes
		t.Fatal(err)
	}
	if got := f.Used(); got != 30 {
		t.Fatalf("Used %d after a rename over a, want 30", got)
	}
	c, err := f.OpenReadWrite(dir+"/a", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt(make([]byte, 10), 30); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := f.Remove(dir + "/a"); err != nil {
		t.Fatal(err)
	}
	if got := f.Used(); got != 0 {
		t.Fatalf("Used %d after removing everything, want 0", got)
	}
}
