package check

import (
	"bufio"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/orch-dev/orch/kit/service"
)

// configDefaults maps every ORCH_ variable a Config reads to its
// envDefault tag ("" for none), embedded structs included.
func configDefaults(cfg any) map[string]string {
	out := map[string]string{}
	var walk func(reflect.Type)
	walk = func(typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("env"), ",")
			switch {
			case tag == "-":
			case tag != "":
				out[service.EnvPrefix+tag] = f.Tag.Get("envDefault")
			case f.Anonymous && f.Type.Kind() == reflect.Struct:
				walk(f.Type)
			}
		}
	}
	walk(reflect.TypeOf(cfg).Elem())
	return out
}

// readmeVars reads the README's configuration table: each variable with
// the text of its default column. A row naming several variables ("A /
// B") splits its default the same way, or gives one default to all.
func readmeVars(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `ORCH_") {
			continue
		}
		cols := strings.Split(line, " | ")
		if len(cols) < 4 {
			t.Errorf("README row %q: want | variable | service | default | meaning |", line)
			continue
		}
		names := strings.Split(strings.TrimPrefix(cols[0], "| "), " / ")
		defaults := strings.Split(cols[2], " / ")
		for i, n := range names {
			d := defaults[0]
			if len(defaults) == len(names) {
				d = defaults[i]
			}
			out[strings.Trim(n, "`")] = strings.TrimSpace(d)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReadmeConfigTable checks the README's configuration table against
// the services' Config structs, names and defaults both: every variable
// has a row, every row is a variable, and the default shown is the
// envDefault tag (a variable without one shows none, or a derived value
// such as `$ORCH_DATA_DIR/workspace`).
func TestReadmeConfigTable(t *testing.T) {
	readme := readmeVars(t)
	// tags[variable][service] is the variable's envDefault in that
	// service's Config.
	tags := map[string]map[string]string{}
	for _, s := range orchServices {
		for name, def := range configDefaults(s.config()) {
			if tags[name] == nil {
				tags[name] = map[string]string{}
			}
			tags[name][s.name] = def
		}
	}
	if len(tags) < 30 {
		t.Fatalf("only %d variables found in the Config structs", len(tags))
	}
	for name, bySvc := range tags {
		shown, ok := readme[name]
		if !ok {
			t.Errorf("README's configuration table has no row for %s", name)
			continue
		}
		defs := slices.Compact(slices.Sorted(maps.Values(bySvc)))
		if len(defs) > 1 {
			// Each service has its own: the row names each.
			for svc, def := range bySvc {
				if !strings.Contains(shown, svc+" `"+def+"`") {
					t.Errorf("README shows the default of %s as %q, the %s's is %q", name, shown, svc, def)
				}
			}
			continue
		}
		switch def := defs[0]; {
		case def != "" && !strings.HasPrefix(shown, "`"+def+"`"):
			t.Errorf("README shows the default of %s as %q, the code has %q", name, shown, def)
		case def == "" && strings.HasPrefix(shown, "`") && !strings.HasPrefix(shown, "`$"):
			t.Errorf("README shows a default %s for %s, which has none in the code", shown, name)
		}
	}
	for name := range readme {
		if _, ok := tags[name]; !ok {
			t.Errorf("README's configuration table names %s, which no service reads", name)
		}
	}
}
