// Command sample sends the sample Gitea pull request webhook to the
// gateway of `make run` (`make sample`), signed as Gitea signs it, and
// prints the gateway's answer.
//
// The gateway is found at ORCH_HTTP_ADDR and signed for with
// ORCH_GITEA_SECRET, the variables `make run` reads, so the two agree.
// Sent again, the same event names the same job ("duplicate": true); with
// -new the pull request's head moves to a new commit, which is a new
// event and a new job.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/orch-dev/orch/deployments/local/sample"
)

func main() {
	var (
		url    = flag.String("url", sample.URLFromAddr(os.Getenv("ORCH_HTTP_ADDR")), "the gateway's base URL (default from ORCH_HTTP_ADDR)")
		secret = flag.String("secret", cmp.Or(os.Getenv("ORCH_GITEA_SECRET"), sample.SecretDefault), "the Gitea webhook secret (default ORCH_GITEA_SECRET)")
		isNew  = flag.Bool("new", false, "move the pull request's head to a new commit: a new event, not a repeat")
	)
	flag.Parse()
	body := sample.PullRequest
	if *isNew {
		var err error
		if body, err = sample.NewEvent(body); err != nil {
			fail(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, answer, err := sample.Send(ctx, http.DefaultClient, *url, *secret, sample.Event, body)
	if err != nil {
		fail(fmt.Errorf("%w (is `make run` running?)", err))
	}
	os.Stdout.Write(answer)
	if code >= 300 {
		fail(fmt.Errorf("the gateway answered %d", code))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "sample:", err)
	os.Exit(1)
}
