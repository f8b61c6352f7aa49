// Package durable holds the filesystem steps that make directory changes
// survive a crash: a file's data can be fsynced and still be lost if the
// directory entry that names it was not.
package durable

import (
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
