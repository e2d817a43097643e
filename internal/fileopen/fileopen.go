// Package fileopen opens the files of the toolhost's file tools (read,
// grep, glob, write, edit, workspace instructions and skills) confined
// under a root however the path changed after it was checked: a directory
// that a session's own shell replaced with a link to elsewhere between a
// tool's check and its open is refused (ErrEscapes), never followed.
//
// Beneath opens a file for reading; OpenRoot gives the *os.Root through
// which every other operation (walks, directories, temporary files,
// renames) resolves its path one component at a time. No open blocks on a
// FIFO. On Linux a path without links opens in one openat2 call
// (RESOLVE_NO_SYMLINKS), about what os.Open costs, and NoLinks tells in
// one such call that a path is its own symlink resolution (the toolhost's
// per-call resolution of a session root and of a file's path).
package fileopen
