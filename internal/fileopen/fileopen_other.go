//go:build !unix

package fileopen

const nonBlock, dirOnly = 0, 0
