//go:build !unix

package fileopen

const nonBlock = 0
