package check

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dockerInstruction is one instruction of a Dockerfile, continuation
// lines joined.
type dockerInstruction struct {
	cmd  string // upper case: FROM, RUN, COPY...
	args string
}

// parseDockerfile splits a Dockerfile into instructions. It is no full
// parser (BuildKit's would bring the whole of BuildKit in), but it is
// enough to check what the images promise.
func parseDockerfile(t *testing.T, path string) []dockerInstruction {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []dockerInstruction
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur.Len() > 0 {
		t.Fatalf("%s: ends in a continuation line", path)
	}
	return out
}

// TestDockerfiles checks each service's image: multi-stage, built from
// the repository root without go.work, static, version-stamped, and
// running as a non-root user.
func TestDockerfiles(t *testing.T) {
	goVersion := goWorkVersion(t)
	for _, svc := range []string{"gateway", "runner", "notifier"} {
		t.Run(svc, func(t *testing.T) {
			path := filepath.Join(repoRoot, "deployments", "docker", svc+".Dockerfile")
			ins := parseDockerfile(t, path)
			var froms []string
			var user, entrypoint string
			all := map[string][]string{}
			for _, in := range ins {
				all[in.cmd] = append(all[in.cmd], in.args)
				switch in.cmd {
				case "FROM":
					froms = append(froms, in.args)
					user, entrypoint = "", "" // per stage: the last one counts
				case "USER":
					user = in.args
				case "ENTRYPOINT":
					entrypoint = in.args
				case "COPY":
					// Sources in the build context (not --from a stage)
					// must exist relative to the repository root.
					if strings.Contains(in.args, "--from=") {
						continue
					}
					fields := strings.Fields(in.args)
					for _, src := range fields[:len(fields)-1] {
						if strings.HasPrefix(src, "--") {
							continue
						}
						if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
							t.Errorf("COPY %s: not in the repository: %v", src, err)
						}
					}
				}
			}
			if len(froms) < 2 {
				t.Fatalf("FROM %v: want a build stage and a runtime stage", froms)
			}
			if !strings.HasPrefix(froms[0], "golang:${GO_VERSION}") {
				t.Errorf("build stage FROM %s, want golang:${GO_VERSION}", froms[0])
			}
			if !slices.Contains(all["ARG"], "GO_VERSION="+goVersion) {
				t.Errorf("ARG %v: want GO_VERSION=%s, the version go.work asks for", all["ARG"], goVersion)
			}
			env := strings.Join(all["ENV"], " ")
			for _, want := range []string{"CGO_ENABLED=0", "GOWORK=off"} {
				if !strings.Contains(env, want) {
					t.Errorf("build ENV %q lacks %s", env, want)
				}
			}
			build := regexp.MustCompile(`go build .*-X main\.version=\$\{VERSION\}.* \./cmd/` + svc + `\b`)
			if !slices.ContainsFunc(all["RUN"], build.MatchString) {
				t.Errorf("no RUN go build stamping main.version of ./cmd/%s", svc)
			}
			if !slices.Contains(all["COPY"], "proto/ /src/proto/") || !slices.Contains(all["COPY"], "kit/ /src/kit/") || !slices.Contains(all["COPY"], "services/"+svc+"/ /src/services/"+svc+"/") {
				t.Errorf("COPY %v: want proto/, kit/ and services/%s/ in the repository's layout", all["COPY"], svc)
			}
			if user == "" || user == "root" || strings.HasPrefix(user, "0") {
				t.Errorf("runtime USER %q, want a non-root user", user)
			}
			if !strings.HasPrefix(entrypoint, "[") || !strings.Contains(entrypoint, "/"+svc+`"`) {
				t.Errorf("ENTRYPOINT %s, want the exec form running %s", entrypoint, svc)
			}
			if svc != "runner" && !strings.HasPrefix(froms[len(froms)-1], "gcr.io/distroless/static") {
				t.Errorf("runtime FROM %s, want distroless static", froms[len(froms)-1])
			}
		})
	}
	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil || !strings.Contains(string(ignore), "\n.git\n") {
		t.Errorf(".dockerignore does not keep .git out of the build context (%v)", err)
	}
}

func goWorkVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(string(data))
	if m == nil {
		t.Fatal("go.work names no go version")
	}
	return m[1]
}
