package runner_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/testkit"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/runner/sandbox"
)

// An HTTP 429 with a long retry-after, seen by the job's egress proxy, is
// the account's usage limit: the job that met it is held (usage_limit)
// until the retry-after has passed, not failed.
func TestProxy429IsUsageLimit(t *testing.T) {
	testkit.RequireBwrap(t)
	e := newEnv(t, "")
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("retry-after", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"type":"error","error":{"type":"rate_limit_error","message":"usage limit"}}`))
	}))
	defer model.Close()
	t.Setenv("ANTHROPIC_BASE_URL", model.URL)
	t.Setenv("ANTHROPIC_API_KEY", "sk-real-429")
	cfg := e.config("r1", e.script(`
hostport=${ANTHROPIC_BASE_URL#http://}; path=/${hostport#*/}; hostport=${hostport%%/*}
timeout 10 bash -c 'exec 3<>/dev/tcp/${1%:*}/${1#*:} || exit 1
	printf "POST %s/v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\ncontent-length: 2\r\nConnection: close\r\n\r\n{}" "$2" "$1" "$ANTHROPIC_API_KEY" >&3
	cat <&3' _ "$hostport" "$path"
exit 1
`))
	cfg.AgentSandbox = sandbox.ModeBwrap
	cfg.AgentNetwork = sandbox.NetOpen
	e.start(cfg)
	j := job("proxy-429", "task-429", proto.KindImplement)
	e.enqueue(j)
	st := e.waitState(j.ID, proto.StateHeld, time.Minute)
	if want := time.Now().Add(time.Hour); st.HeldReason != proto.HoldUsageLimit || st.HeldUntil.Before(want.Add(-time.Minute)) || st.HeldUntil.After(want) {
		t.Errorf("held %q until %v, want usage_limit until about %v", st.HeldReason, st.HeldUntil, want)
	}
}
