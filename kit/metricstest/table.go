package metricstest

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
)

// Row is one row of the README's metrics table.
type Row struct {
	// Name is the metric's name, Service the service that serves it
	// (gateway, runner, notifier or all), Type its type.
	Name, Service, Type string
	// Labels are the label names the row lists.
	Labels []string
}

var (
	tableRow   = regexp.MustCompile("^\\| `(orch_[a-z0-9_]+)` \\| ([a-z]+) \\| ([a-z]+) \\|([^|]*)\\|")
	tableLabel = regexp.MustCompile("`([a-z_]+)`")
)

// ReadTable reads the metrics table of the README at path: the rows whose
// first cell is a backquoted orch_ name, then service, type and labels.
func ReadTable(path string) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []Row
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := tableRow.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		r := Row{Name: m[1], Service: m[2], Type: m[3]}
		for _, l := range tableLabel.FindAllStringSubmatch(m[4], -1) {
			r.Labels = append(r.Labels, l[1])
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rows) < 20 {
		return nil, fmt.Errorf("%s: %d metric rows found: has the table moved or changed its shape?", path, len(rows))
	}
	return rows, nil
}
