// Package fileopen opens files for reading in one system call.
//
// On Linux os.Open makes six for a regular file: the open, then, because
// it tries every file it opens on the netpoller, two fcntl calls to set
// O_NONBLOCK, an epoll_ctl that fails (regular files cannot be polled) and
// two more fcntl calls to clear O_NONBLOCK again. Read opens with one
// openat and wraps the descriptor with os.NewFile (one fcntl to see that
// it is blocking): the same *os.File, read the same way (plain read
// calls, as os.Open's files end up using for regular files), for a third
// of the system calls. The toolhost opens a file in every read call and
// every instruction file of a workspace context.
package fileopen
