// Package durable holds the filesystem steps that make directory changes
// survive a crash: a file's data can be fsynced and still be lost if the
// directory entry that names it was not.
package durable

import (
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// SyncDir fsyncs a directory, making the entries created, renamed or removed
// in it durable.
func SyncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return err
	}
	return d.Close()
}

// MkdirAll creates dir and any missing parents, and fsyncs the parent of each
// directory it creates, so that a crash cannot lose the directory — and every
// file fsynced in it — afterwards.
func MkdirAll(fs vfs.FS, dir string) error {
	var parents []string
	for d := dir; ; {
		if _, err := fs.Stat(d); err == nil {
			break
		}
		p := fs.PathDir(d)
		parents = append(parents, p)
		if p == d {
			break
		}
		d = p
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := len(parents) - 1; i >= 0; i-- {
		if err := SyncDir(fs, parents[i]); err != nil {
			return err
		}
	}
	return nil
}

// TmpSuffix names the temporary file WriteFile renames into place: one a
// crash left behind is garbage, and a reader of the directory skips it.
const TmpSuffix = ".tmp"

// WriteFile makes the file at path hold exactly data, crash-safely: it writes
// path+TmpSuffix, fsyncs it, renames it over path and fsyncs the directory,
// so a crash leaves the old file or the new one, never a part. perm, unless
// 0, is the new file's permission bits, set with os.Chmod (so only on the
// operating system's filesystem, vfs.Default). On an error the temporary
// file is removed.
func WriteFile(fs vfs.FS, path string, data []byte, perm os.FileMode) (err error) {
	tmp := path + TmpSuffix
	defer func() {
		if err != nil {
			_ = fs.Remove(tmp)
		}
	}()
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if perm != 0 {
		if err := os.Chmod(tmp, perm); err != nil {
			f.Close()
			return err
		}
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fs.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(fs, fs.PathDir(path))
}
