// Package tail reads the end of a file, as an alert or a result line needs
// the end of an agent's log.
package tail

import (
	"bufio"
	"io"
	"os"
)

// Lines returns the last n lines of the file at path, reading at most its
// last window bytes (the first of them may be the end of a longer line).
// It returns nil when the file cannot be read.
func Lines(path string, n int, window int64) []string {
	if path == "" || n <= 0 {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		if _, err := f.Seek(-window, io.SeekEnd); err != nil {
			return nil
		}
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, min(window+1, 64<<10)), int(window)+1)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines
}
