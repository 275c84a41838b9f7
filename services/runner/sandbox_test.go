package runner_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/orch-dev/orch/kit/metricstest"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner"
	"github.com/orch-dev/orch/services/runner/sandbox"
)

// hostileAgent tries everything a confined agent must not manage, and the
// few things it must. Each check prints "PASS <name>" or "FAIL <name>
// <why>"; it always exits 0. Its arguments are in the variables set at
// its top (see TestHostileAgentConfined).
const hostileAgent = `
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1 $2"; }
# reading: none of these may be readable
for f in "$RUNNER_SECRET" "$GATEWAY_SECRET" "$OTHER_WORKTREE/other.txt" "$OTHER_HOME/.claude/state"; do
	if cat "$f" >/dev/null 2>&1; then fail read "$f"; else pass "read-denied $f"; fi
done
if ls "$WORKSPACE/repos" "$WORKSPACE/worktrees/widgets" 2>/dev/null | grep -q task-other; then fail list-worktrees; else pass list-worktrees-denied; fi
# the host's TLS private keys (a root runner's agent could list them
# when /etc/ssl was bound whole)
if ls /etc/ssl/private >/dev/null 2>&1; then fail list-private-keys; else pass list-private-keys-denied; fi
# the secret marker in any process's environment
if cat /proc/*/environ 2>/dev/null | tr '\0' '\n' | grep -q "$MARKER"; then fail environ-marker; else pass environ-marker-absent; fi
if env | grep -q "$REAL_KEY"; then fail env-real-key; else pass env-real-key-absent; fi
if [ "$ANTHROPIC_API_KEY" = "orch-placeholder-key" ]; then pass env-placeholder; else fail env-placeholder "$ANTHROPIC_API_KEY"; fi
# connecting straight out: NATS and another listener of the host's
for port in "$NATS_PORT" "$HOST_PORT"; do
	if timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then fail connect "$port"; else pass "connect-denied $port"; fi
done
# through the proxy: GET http://127.0.0.1:<port>/ as a proxy client
proxied() {
	timeout 10 bash -c '
		exec 3<>/dev/tcp/127.0.0.1/'$FORWARD_PORT' || exit 1
		printf "GET http://127.0.0.1:%s/ HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n" "$1" "$1" >&3
		cat <&3' _ "$1"
}
if proxied "$DENIED_PORT" | grep -q denied-secret; then fail proxy-denied; else pass proxy-denied; fi
if proxied "$ALLOWED_PORT" | grep -q allowed-body; then pass proxy-allowed; else fail proxy-allowed; fi
# the model request, to ANTHROPIC_BASE_URL with the placeholder key
hostport=${ANTHROPIC_BASE_URL#http://}; path=/${hostport#*/}; hostport=${hostport%%/*}
body='{"model":"claude-test","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'
answer=$(timeout 10 bash -c '
	exec 3<>/dev/tcp/${1%:*}/${1#*:} || exit 1
	printf "POST %s/v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\ncontent-length: %s\r\nConnection: close\r\n\r\n%s" "$2" "$1" "$ANTHROPIC_API_KEY" "${#3}" "$3" >&3
	cat <&3' _ "$hostport" "$path" "$body")
if echo "$answer" | grep -q model-answer; then pass model; else fail model "$answer"; fi
# writing: only the worktree and the home
# (A path the sandbox does not have may land in its private /tmp: the
# test looks for each of them on the host afterwards.)
for f in /usr/orch-x /orch-x /etc/orch-x /etc/hosts "$OTHER_WORKTREE/x" "$GIT_COMMON/config" "$GIT_COMMON/hooks/pre-commit" "$PWD/.git"; do
	if (echo x >> "$f") 2>/dev/null; then fail write "$f"; else pass "write-denied $f"; fi
done
for f in "$RUNNER_DATA/orch-x" "$WORKSPACE/repos/orch-x" "$WORKSPACE/homes/widgets/task-other/orch-x"; do
	(mkdir -p "${f%/*}" && echo x >> "$f") 2>/dev/null
done
if echo mine > "$PWD/mine.txt"; then pass write-worktree; else fail write-worktree; fi
if mkdir -p "$HOME/.claude" && echo state > "$HOME/.claude/state"; then pass write-home; else fail write-home; fi
git add mine.txt && git -c user.name=agent -c user.email=agent@example.com commit -q -m "confined commit" && pass commit || fail commit
exit 0
`

// TestHostileAgentConfined runs a hostile agent as a real runner's job
// under bubblewrap with the allowlist network: it cannot read the
// runner's or a gateway's data, another task's worktree or home, a
// secret in any process's environment; cannot connect to NATS or another
// listener of the host; cannot reach a host outside the allowlist through
// the proxy; cannot write outside its worktree and home. It can write and
// commit in its worktree, write its home, reach an allowed host, and its
// model request arrives upstream with the real key while it holds only
// the placeholder. The job ends done; its log holds the denial.
func TestHostileAgentConfined(t *testing.T) {
	testkit.RequireBwrap(t)
	e := newEnv(t, "")
	marker := "orch-marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	realKey := "sk-real-" + marker

	// Secrets the agent must not find: in the runner's data directory,
	// in a gateway's spool, in the environment of this process (the
	// runner's) and of another process.
	runnerSecret := filepath.Join(e.dir, "runner-secret.txt")
	writeFile(t, runnerSecret, marker)
	gatewayDir := t.TempDir()
	gatewaySecret := filepath.Join(gatewayDir, "spool", "0001.json")
	writeFile(t, gatewaySecret, marker)
	t.Setenv("ORCH_GITEA_SECRET", marker)
	other := exec.Command("sleep", "120")
	other.Env = append(os.Environ(), "ORCH_TEST_OTHER_SECRET="+marker)
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })

	// The model API and two hosts: one the allowlist names, one not.
	var modelKeys sync.Map
	var modelCalls atomic.Int32
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		modelCalls.Add(1)
		modelKeys.Store(r.Header.Get("x-api-key"), true)
		w.Header().Set("content-type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"model-answer"}],"usage":{"input_tokens":3,"output_tokens":1}}`)
	}))
	defer model.Close()
	t.Setenv("ANTHROPIC_BASE_URL", model.URL)
	t.Setenv("ANTHROPIC_API_KEY", realKey)
	allowed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "allowed-body") }))
	defer allowed.Close()
	var deniedHits atomic.Int32
	denied := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		deniedHits.Add(1)
		_, _ = io.WriteString(w, "denied-secret")
	}))
	defer denied.Close()
	// A listener of the host's, which nothing may reach.
	hostLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var hostHits atomic.Int32
	go func() {
		for {
			c, err := hostLn.Accept()
			if err != nil {
				return
			}
			hostHits.Add(1)
			c.Close()
		}
	}()
	defer hostLn.Close()

	ws := filepath.Join(e.dir, "ws-r1")
	vars := map[string]string{
		"MARKER": marker, "REAL_KEY": realKey, "RUNNER_SECRET": runnerSecret, "GATEWAY_SECRET": gatewaySecret,
		"RUNNER_DATA": e.dir, "WORKSPACE": ws,
		"OTHER_WORKTREE": filepath.Join(ws, "worktrees", "widgets", "task-other"),
		"OTHER_HOME":     filepath.Join(ws, "homes", "widgets", "task-other"),
		"GIT_COMMON":     filepath.Join(ws, "repos", "widgets.git"),
		"NATS_PORT":      port(t, e.srv.URL()), "HOST_PORT": port(t, hostLn.Addr().String()),
		"DENIED_PORT": port(t, denied.URL), "ALLOWED_PORT": port(t, allowed.URL),
		"FORWARD_PORT": strconv.Itoa(sandbox.ForwardPort),
	}
	var head strings.Builder
	for k, v := range vars {
		fmt.Fprintf(&head, "%s='%s'\n", k, v)
	}
	// The first job, of another task, leaves a worktree and a home with
	// something in each; the second is the hostile agent.
	agentCmd := e.script(head.String() + `
case "$ORCH_TASK" in
task-other) echo other > other.txt; mkdir -p "$HOME/.claude"; echo state > "$HOME/.claude/state"; exit 0 ;;
esac
` + hostileAgent)
	cfg := e.config("r1", agentCmd)
	cfg.AgentSandbox = sandbox.ModeBwrap
	cfg.AgentSandboxRW = nil
	cfg.AgentEgress = []string{"127.0.0.1:" + port(t, allowed.URL)}
	// Its init is orch-sandbox-init, as where `make build` or the image
	// installs the runner (the other tests' is the test binary itself).
	cfg.AgentSandboxInit = testkit.Build(t, t.TempDir(), "github.com/orch-dev/orch/services/runner/cmd/orch-sandbox-init")
	e.start(cfg)

	first := job("hostile-1", "task-other", proto.KindImplement)
	e.enqueue(first)
	if st := e.waitState(string(first.ID), proto.StateDone, time.Minute); st.Sandbox != "bwrap" || st.Network != "allowlist" || st.Limits != "none" {
		t.Fatalf("record says sandbox %q network %q limits %q, want bwrap allowlist none", st.Sandbox, st.Network, st.Limits)
	}
	hostile := job("hostile-2", "task-hostile", proto.KindImplement)
	e.enqueue(hostile)
	st := e.waitState(string(hostile.ID), proto.StateDone, time.Minute)

	log, err := os.ReadFile(st.Log)
	if err != nil {
		t.Fatal(err)
	}
	var passed []string
	sc := bufio.NewScanner(strings.NewReader(string(log)))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "FAIL ") {
			t.Errorf("the hostile agent managed: %s", line)
		}
		if name, ok := strings.CutPrefix(line, "PASS "); ok {
			passed = append(passed, strings.Fields(name)[0])
		}
	}
	for _, want := range []string{"read-denied", "list-worktrees-denied", "list-private-keys-denied", "environ-marker-absent", "env-real-key-absent", "env-placeholder",
		"connect-denied", "proxy-denied", "proxy-allowed", "model", "write-denied", "write-worktree", "write-home", "commit"} {
		if !contains(passed, want) {
			t.Errorf("check %s did not pass; the agent's log:\n%s", want, log)
		}
	}
	if !strings.Contains(string(log), "orch: egress denied 127.0.0.1:"+port(t, denied.URL)) {
		t.Errorf("the job's log has no denial line for the refused host:\n%s", log)
	}
	if deniedHits.Load() != 0 || hostHits.Load() != 0 {
		t.Errorf("the refused host got %d requests and the host's listener %d connections, want none", deniedHits.Load(), hostHits.Load())
	}
	if _, ok := modelKeys.Load(realKey); !ok || modelCalls.Load() != 1 {
		var keys []string
		modelKeys.Range(func(k, _ any) bool { keys = append(keys, k.(string)); return true })
		t.Errorf("the model API got %d requests with keys %q, want one with the real key", modelCalls.Load(), keys)
	}
	for _, f := range []string{filepath.Join(e.dir, "orch-x"), filepath.Join(ws, "repos", "orch-x"), filepath.Join(ws, "homes", "widgets", "task-other", "orch-x"), "/orch-x", "/usr/orch-x"} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("the hostile agent wrote %s on the host", f)
		}
	}
	// The task's home is in the workspace, and the commit in the clone.
	if _, err := os.Stat(filepath.Join(ws, "homes", "widgets", "task-hostile", ".claude", "state")); err != nil {
		t.Errorf("the agent's ~/.claude is not in the task's home: %v", err)
	}
	out, err := exec.Command("git", "-C", filepath.Join(ws, "repos", "widgets.git"), "log", "-1", "--format=%s", "agent/task-hostile").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "confined commit" {
		t.Errorf("the confined commit is not on the task's branch: %s %v", out, err)
	}
}

// TestSandboxRequiredWithoutBwrap: ORCH_AGENT_SANDBOX=bwrap on a host
// where bwrap is not found (a PATH without it) stops the runner at start,
// naming why.
func TestSandboxRequiredWithoutBwrap(t *testing.T) {
	e := newEnv(t, "")
	t.Setenv("PATH", t.TempDir())
	cfg := e.config("r1", "true")
	cfg.AgentSandbox = sandbox.ModeBwrap
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := runner.Run(ctx, cfg, zaptest.NewLogger(t))
	if err == nil || !strings.Contains(err.Error(), "ORCH_AGENT_SANDBOX=bwrap") || !strings.Contains(err.Error(), "bwrap (bubblewrap) is not on PATH") {
		t.Fatalf("runner.Run = %v, want it to refuse to start naming bwrap missing from PATH", err)
	}
}

// port is the port of a URL or host:port.
func port(t *testing.T, s string) string {
	t.Helper()
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	_, p, err := net.SplitHostPort(strings.TrimSuffix(s, "/"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestMemoryLimitNamedInError: an agent past ORCH_AGENT_MEMORY_MAX fails
// its allocation, confined or not, and the job's error names the limit;
// the record says the limits were rlimits.
func TestMemoryLimitNamedInError(t *testing.T) {
	for _, mode := range []sandbox.Mode{sandbox.ModeBwrap, sandbox.ModeNone} {
		t.Run(string(mode), func(t *testing.T) {
			if mode == sandbox.ModeBwrap {
				testkit.RequireBwrap(t)
			}
			e := newEnv(t, "")
			cfg := e.config("r1", e.script(`awk 'BEGIN { s = "x"; while (1) s = s s }'`))
			cfg.AgentSandbox = mode
			cfg.AgentMemoryMax = 64 << 20
			cfg.MaxAttempts = 1
			e.start(cfg)
			j := job("oom-"+string(mode), "task-oom", proto.KindImplement)
			e.enqueue(j)
			st := e.waitState(j.ID, proto.StateFailed, time.Minute)
			if !strings.Contains(st.Error, "out of memory") || !strings.Contains(st.Error, "ORCH_AGENT_MEMORY_MAX") {
				t.Errorf("error %q does not say the agent ran out of its memory limit", st.Error)
			}
			if st.Limits != "rlimit" {
				t.Errorf("record says limits %q, want rlimit", st.Limits)
			}
		})
	}
}

// TestSandboxSaidEverywhere: how agents run is on /readyz's body, in
// orch_runner_sandbox and on every job's record; unconfined, /readyz
// warns.
func TestSandboxSaidEverywhere(t *testing.T) {
	for _, mode := range []sandbox.Mode{sandbox.ModeBwrap, sandbox.ModeNone} {
		t.Run(string(mode), func(t *testing.T) {
			if mode == sandbox.ModeBwrap {
				testkit.RequireBwrap(t)
			}
			e := newEnv(t, "")
			cfg := e.config("r1", e.script(`exit 0`))
			cfg.AgentSandbox = mode
			ln := testkit.Listen(t)
			cfg.Listener = ln
			base := "http://" + ln.Addr().String()
			e.start(cfg)
			j := job("said-"+string(mode), "task-said", proto.KindImplement)
			e.enqueue(j)
			if st := e.waitState(j.ID, proto.StateDone, time.Minute); st.Sandbox != string(mode) {
				t.Errorf("record says sandbox %q, want %q", st.Sandbox, mode)
			}
			var body string
			natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
				var code int
				if code, body = metricstest.Get(base + "/readyz"); code != http.StatusOK {
					return fmt.Errorf("/readyz = %d %s", code, body)
				}
				return nil
			})
			if !strings.Contains(body, `"sandbox":"`+string(mode)+`"`) || strings.Contains(body, "unconfined") != (mode == sandbox.ModeNone) {
				t.Errorf("/readyz says %s for sandbox %s", body, mode)
			}
			if v, _ := metricstest.Scrape(t, base+"/metrics").Value(`orch_runner_sandbox{mode="` + string(mode) + `"}`); v != 1 {
				t.Errorf("orch_runner_sandbox{mode=%q} = %v, want 1", mode, v)
			}
		})
	}
}

// TestSandboxNetworks: under ORCH_AGENT_NETWORK=open a confined agent
// reaches the host's listeners itself, and its model request still goes
// through the job's proxy (on the host's loopback), which puts the real
// key in; it holds only the placeholder and no proxy settings. Under none
// it reaches nothing and is given no model address or key.
func TestSandboxNetworks(t *testing.T) {
	testkit.RequireBwrap(t)
	for _, network := range []sandbox.Network{sandbox.NetOpen, sandbox.NetNone} {
		t.Run(string(network), func(t *testing.T) {
			e := newEnv(t, "")
			var keys sync.Map
			model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				keys.Store(r.Header.Get("x-api-key"), true)
				_, _ = io.WriteString(w, `{"type":"message","content":[{"type":"text","text":"model-answer"}],"usage":{"input_tokens":1,"output_tokens":1}}`)
			}))
			defer model.Close()
			t.Setenv("ANTHROPIC_BASE_URL", model.URL)
			t.Setenv("ANTHROPIC_API_KEY", "sk-real-networks")
			hostLn := testkit.Listen(t)
			go func() {
				for {
					c, err := hostLn.Accept()
					if err != nil {
						return
					}
					_, _ = io.WriteString(c, "host-listener\n")
					c.Close()
				}
			}()
			cfg := e.config("r1", e.script(`
if timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/`+port(t, hostLn.Addr().String())+`; cat <&3' 2>/dev/null | grep -q host-listener; then echo "REACHED host"; fi
env | grep -q -i '^https\?_proxy=' && echo "HAS proxy settings"
env | grep -q sk-real-networks && echo "HAS real key"
echo "KEY ${ANTHROPIC_API_KEY:-none} BASE ${ANTHROPIC_BASE_URL:-none}"
if [ -n "${ANTHROPIC_BASE_URL:-}" ]; then
	hostport=${ANTHROPIC_BASE_URL#http://}; path=/${hostport#*/}; hostport=${hostport%%/*}
	timeout 10 bash -c 'exec 3<>/dev/tcp/${1%:*}/${1#*:} || exit 1
		printf "POST %s/v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\ncontent-length: 2\r\nConnection: close\r\n\r\n{}" "$2" "$1" "$ANTHROPIC_API_KEY" >&3
		cat <&3' _ "$hostport" "$path" | grep -q model-answer && echo "MODEL answered"
fi
exit 0
`))
			cfg.AgentSandbox = sandbox.ModeBwrap
			cfg.AgentNetwork = network
			e.start(cfg)
			j := job("net-"+string(network), "task-net", proto.KindImplement)
			e.enqueue(j)
			st := e.waitState(j.ID, proto.StateDone, time.Minute)
			if st.Network != string(network) {
				t.Errorf("record says network %q, want %q", st.Network, network)
			}
			data, err := os.ReadFile(st.Log)
			if err != nil {
				t.Fatal(err)
			}
			log := string(data)
			if strings.Contains(log, "HAS ") {
				t.Errorf("the agent's environment holds what it must not:\n%s", log)
			}
			switch network {
			case sandbox.NetOpen:
				if !strings.Contains(log, "REACHED host") || !strings.Contains(log, "KEY orch-placeholder-key") || !strings.Contains(log, "MODEL answered") {
					t.Errorf("open: want the host reached and the model answering the placeholder key:\n%s", log)
				}
				if _, ok := keys.Load("sk-real-networks"); !ok {
					t.Error("open: the model API did not get the real key")
				}
			case sandbox.NetNone:
				if strings.Contains(log, "REACHED") || !strings.Contains(log, "KEY none BASE none") {
					t.Errorf("none: want nothing reached, no key, no model address:\n%s", log)
				}
			}
		})
	}
}
