package testkit

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Fixture reads the recorded payload dir/name.json and the headers its
// sender sent with it (dir/name.headers.json, a JSON object of header
// names to values), as the fixtures under each module's testdata are
// kept.
func Fixture(t testing.TB, dir, name string) (body []byte, headers map[string]string) {
	t.Helper()
	body = ReadFile(t, filepath.Join(dir, name+".json"))
	if err := json.Unmarshal(ReadFile(t, filepath.Join(dir, name+".headers.json")), &headers); err != nil {
		t.Fatalf("%s headers: %v", name, err)
	}
	return body, headers
}

// ReadFile returns the content of the file at path, and fails the test
// when it cannot be read.
func ReadFile(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// EditJSON decodes the JSON object body, lets edit change it, and returns
// it encoded again. With a nil edit it returns body as it is: a recorded
// payload byte for byte, so that its recorded signature still holds.
func EditJSON(t testing.TB, body []byte, edit func(m map[string]any)) []byte {
	t.Helper()
	if edit == nil {
		return body
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// RegistryYAML is a projects.yaml serving project ProjectKey from the
// Gitea repository acme/widgets, with fields ("name: value", one a line)
// added to its entry.
func RegistryYAML(fields ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "projects:\n  - key: %s\n    gitea_repo: acme/widgets\n", ProjectKey)
	for _, f := range fields {
		fmt.Fprintf(&b, "    %s\n", f)
	}
	return b.String()
}

// Listen listens on a free loopback port for a service under test; the
// listener closes with the test unless the service has closed it first.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}
