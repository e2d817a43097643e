package render

import "strings"

type diffOp struct {
	kind byte // ' ', '-', '+'
	text string
}

// maxDiffCells bounds the LCS table; larger inputs show as a full rewrite.
const maxDiffCells = 250_000

// lineDiff returns a line-level diff of a and b by longest common
// subsequence.
func lineDiff(a, b string) []diffOp {
	al, bl := splitLines(a), splitLines(b)
	if len(al)*len(bl) > maxDiffCells {
		ops := make([]diffOp, 0, len(al)+len(bl))
		for _, l := range al {
			ops = append(ops, diffOp{'-', l})
		}
		for _, l := range bl {
			ops = append(ops, diffOp{'+', l})
		}
		return ops
	}
	n, m := len(al), len(bl)
	lcs := make([][]int32, n+1)
	for i := range lcs {
		lcs[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if al[i] == bl[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var ops []diffOp
	i, j := 0, 0
	for i < n && j < m {
		switch {
		case al[i] == bl[j]:
			ops = append(ops, diffOp{' ', al[i]})
			i++
			j++
		case lcs[i+1][j] >= lcs[i][j+1]:
			ops = append(ops, diffOp{'-', al[i]})
			i++
		default:
			ops = append(ops, diffOp{'+', bl[j]})
			j++
		}
	}
	for ; i < n; i++ {
		ops = append(ops, diffOp{'-', al[i]})
	}
	for ; j < m; j++ {
		ops = append(ops, diffOp{'+', bl[j]})
	}
	return ops
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}
