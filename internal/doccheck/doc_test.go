package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mdName is a file name ending in .md, with the path before it if any.
var mdName = regexp.MustCompile(`[A-Za-z0-9_./-]+\.md\b`)

// capitalised: a document's bare name (README, COMPATIBILITY), not an
// output named in its context (matrix.md).
var capitalised = regexp.MustCompile(`^[A-Z][A-Z0-9_-]*\.md$`)

// repoRoot is the directory holding go.mod, above this package's.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// TestNamedFilesExist: every file a document names is in the repository.
func TestNamedFilesExist(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch {
			case rel != "." && strings.HasPrefix(d.Name(), "."), d.Name() == "testdata", rel == filepath.Join("bench", "results"):
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".md") && d.Name() != "doc.go" {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for _, name := range mdName.FindAllString(string(text), -1) {
			if strings.HasPrefix(name, "/") || !strings.Contains(name, "/") && !capitalised.MatchString(name) {
				continue
			}
			if exists(filepath.Join(filepath.Dir(path), name)) || exists(filepath.Join(root, name)) {
				continue
			}
			t.Errorf("%s names %s, which is not in the repository", rel, name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 3 {
		t.Fatalf("checked %d documents: the walk missed README.md and the doc.go files", checked)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
