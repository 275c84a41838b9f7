package gateway_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/kit/status"
	"github.com/orch-dev/orch/kit/status/statustest"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/proto/joblog"
)

// A followed log lasts as long as its attempt, but not past the gateway:
// a gateway told to stop ends the logs it is streaming and returns at
// once, instead of waiting out its shutdown grace and failing.
func TestFollowedLogsDoNotHoldUpTheShutdown(t *testing.T) {
	t.Parallel()
	e, g := newGateway(t, nil)
	_, js, kv := natstest.Connect(t, e.srv)
	job := proto.Job{Schema: proto.SchemaVersion, ID: "follow-1", Kind: proto.KindFix, Project: "widgets", Task: proto.Task{ID: "wid-1"}}
	statustest.Set(t, status.New(kv), &job, func(s *proto.Status) { s.State, s.Attempt = proto.StateRunning, 1 })
	msg := nats.NewMsg(proto.LogSubject(job.ID, 1))
	msg.Header.Set(joblog.HeaderKind, joblog.KindBoth)
	msg.Data = []byte("first line\n")
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}

	req, _ := http.NewRequest(http.MethodGet, g.url+"/jobs/"+job.ID+"/log?follow=1", nil)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "first line\n" {
		t.Fatalf("followed log: %q, %v", line, err)
	}

	stopped := make(chan struct{})
	go func() { defer close(stopped); g.stop(t) }() // fails the test if Run returns an error
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway did not stop")
	}
	if rest, err := bufio.NewReader(resp.Body).ReadString('\n'); err == nil || strings.TrimSpace(rest) != "" {
		t.Errorf("the followed log goes on after the gateway stopped: %q, %v", rest, err)
	}
}
