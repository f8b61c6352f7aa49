// Package doccheck has no code: its test keeps the repository's documents
// honest about the documents they send readers to. Every Markdown file and
// every package doc.go may name a Markdown file by a path
// (bench/README.md) or by its capitalised name (README.md,
// COMPATIBILITY.md), and each one named must be in the repository,
// relative to the naming file or to the repository's root. Generated files
// (bench/results/) and absolute paths (/tmp/…) are not checked.
package doccheck
