package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orch-dev/orch/kit/embedded"
	"github.com/orch-dev/orch/kit/natsauth"
	"github.com/orch-dev/orch/kit/natstest"
	"github.com/orch-dev/orch/proto"
)

func TestMain(m *testing.M) { natstest.VerifyTestMain(m) }

// client is one user's connection, with the permission violations the
// server reported to it.
type client struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	errs  chan error
	topol proto.Topology
}

// login connects as user with its password and inbox prefix, as
// service.Connect does.
func login(t *testing.T, s *embedded.Server, user string) *client {
	t.Helper()
	c := &client{errs: make(chan error, 64)}
	opts := []nats.Option{nats.UserInfo(user, natstest.Password(user)), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case c.errs <- err:
		default:
		}
	})}
	if user != natsauth.Admin {
		opts = append(opts, nats.CustomInboxPrefix(natsauth.InboxPrefix(user)))
	}
	nc, err := nats.Connect(s.URL(), opts...)
	if err != nil {
		t.Fatalf("%s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return c
}

// call runs op, which must succeed.
func (c *client) call(t *testing.T, what string, op func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := op(ctx); err != nil {
		var seen []error
		for len(c.errs) > 0 {
			seen = append(seen, <-c.errs)
		}
		t.Fatalf("%s: %v (server said %v)", what, err, seen)
	}
}

// denied runs op, which the server must refuse with a permission
// violation naming subject.
func (c *client) denied(t *testing.T, subject string, op func(context.Context) error) {
	t.Helper()
	c.refused(t, `"`+subject+`"`, op)
}

// deniedPrefix is denied for a violation on a subject starting with prefix.
func (c *client) deniedPrefix(t *testing.T, prefix string, op func(context.Context) error) {
	t.Helper()
	c.refused(t, `"`+prefix, op)
}

// refused runs op, which the server must refuse with a permission
// violation whose text holds quoted.
func (c *client) refused(t *testing.T, quoted string, op func(context.Context) error) {
	t.Helper()
	subject := quoted
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), quoted) {
				cancel()
				<-done
				return
			}
		case err := <-done:
			if err == nil {
				t.Fatalf("%s: allowed, want a permission violation", subject)
			}
			// A JetStream request that was refused times out: wait for
			// the violation that says why.
			select {
			case e := <-c.errs:
				if errors.Is(e, nats.ErrPermissionViolation) && strings.Contains(e.Error(), quoted) {
					return
				}
				t.Fatalf("%s: %v, then %v; want a permission violation", subject, err, e)
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: %v, want a permission violation", subject, err)
			}
		}
	}
}

// setup ensures the whole topology as the gateway would, the notifier's
// writeback bucket as the notifier and the gateway's own buckets, and
// returns a connection per user.
func setup(t *testing.T) map[string]*client {
	t.Helper()
	s := natstest.AuthServer(t)
	cs := map[string]*client{}
	for _, u := range natsauth.Users() {
		cs[u] = login(t, s, u)
	}
	var topo proto.Topology
	gw := cs[natsauth.Gateway]
	gw.call(t, "gateway ensures the topology", func(ctx context.Context) error { _, err := topo.Ensure(ctx, gw.js); return err })
	gw.call(t, "gateway ensures ui_sessions", func(ctx context.Context) error {
		_, err := proto.EnsureBucket(ctx, gw.js, topo.UISessionsBucket())
		return err
	})
	nt := cs[natsauth.Notifier]
	nt.call(t, "notifier ensures writeback", func(ctx context.Context) error {
		_, err := proto.EnsureBucket(ctx, nt.js, topo.WritebackBucket())
		return err
	})
	return cs
}

func TestAnonymousClientRefused(t *testing.T) {
	s := natstest.AuthServer(t)
	nc, err := nats.Connect(s.URL(), nats.NoReconnect())
	if err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected")
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("anonymous: %v, want an authorization violation", err)
	}
	nc, err = nats.Connect(s.URL(), nats.NoReconnect(), nats.UserInfo(natsauth.Runner, "wrong"))
	if err == nil {
		nc.Close()
		t.Fatal("a wrong password connected")
	}
}

// TestEveryServiceEnsuresTheTopology: each service calls Ensure at start,
// whichever starts first, and every later one finds it as configured.
func TestEveryServiceEnsuresTheTopology(t *testing.T) {
	for _, first := range []string{natsauth.Runner, natsauth.Notifier, natsauth.Gateway} {
		t.Run(first+" first", func(t *testing.T) {
			s := natstest.AuthServer(t)
			var topo proto.Topology
			for _, u := range []string{first, natsauth.Gateway, natsauth.Runner, natsauth.Notifier} {
				c := login(t, s, u)
				c.call(t, u+" ensures the topology", func(ctx context.Context) error { _, err := topo.Ensure(ctx, c.js); return err })
			}
		})
	}
}

// TestServicesDoTheirWork walks each service's calls: what it publishes,
// reads and consumes. The e2e tests of deployments/local run the real
// services under these users too.
func TestServicesDoTheirWork(t *testing.T) {
	cs := setup(t)
	gw, rn, nt := cs[natsauth.Gateway], cs[natsauth.Runner], cs[natsauth.Notifier]
	var topo proto.Topology

	// The gateway queues a job and writes its status.
	gw.call(t, "gateway publishes a job", func(ctx context.Context) error {
		_, err := gw.js.Publish(ctx, proto.JobSubject("acme", proto.KindReview), []byte(`{}`), jetstream.WithMsgID("job-1"))
		return err
	})
	for _, c := range []*client{gw, rn, nt} {
		c.call(t, "status write", func(ctx context.Context) error {
			kv, err := c.js.KeyValue(ctx, proto.BucketJobs)
			if err != nil {
				return err
			}
			if _, err := kv.Put(ctx, "job-1", []byte(`{"state":"queued"}`)); err != nil {
				return err
			}
			if _, err := kv.Get(ctx, "job-1"); err != nil {
				return err
			}
			w, err := kv.Watch(ctx, "job-1")
			if err != nil {
				return err
			}
			defer w.Stop()
			if e := <-w.Updates(); e == nil {
				return errors.New("watch: no value")
			}
			return nil
		})
	}
	// The runner pulls it, publishes its output and the pipeline's next job,
	// holds a task lock.
	rn.call(t, "runner consumes", func(ctx context.Context) error {
		cons, err := rn.js.CreateOrUpdateConsumer(ctx, proto.StreamJobs, proto.RunnerConsumer(1, 3, 30*time.Second))
		if err != nil {
			return err
		}
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return err
		}
		if err := msg.InProgress(); err != nil {
			return err
		}
		if err := msg.DoubleAck(ctx); err != nil {
			return err
		}
		if _, err := rn.js.Publish(ctx, proto.LogSubject("job-1", 1), []byte("hello")); err != nil {
			return err
		}
		if _, err := rn.js.Publish(ctx, proto.JobSubject("acme", proto.KindFix), []byte(`{}`), jetstream.WithMsgID("job-2")); err != nil {
			return err
		}
		locks, err := rn.js.KeyValue(ctx, proto.BucketTaskLocks)
		if err != nil {
			return err
		}
		if _, err := locks.Create(ctx, "acme.t1", []byte("runner")); err != nil {
			return err
		}
		// Admission reads the slots with one batched direct get.
		if _, err := locks.Create(ctx, "slot.acme.0", []byte("runner")); err != nil {
			return err
		}
		m, err := rn.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+proto.BucketTaskLocks,
			[]byte(`{"multi_last":["$KV.`+proto.BucketTaskLocks+`.slot.>"]}`))
		if err != nil {
			return fmt.Errorf("batched direct get of the slots: %w", err)
		}
		if m.Header.Get(jetstream.SubjectHeader) != "$KV."+proto.BucketTaskLocks+".slot.acme.0" {
			return fmt.Errorf("batched direct get of the slots answered %v", m.Header)
		}
		_, err = rn.js.Stream(ctx, proto.StreamTaskLocks)
		return err
	})
	// The gateway and the notifier read the output.
	for _, c := range []*client{gw, nt} {
		c.call(t, "log read", func(ctx context.Context) error {
			s, err := c.js.Stream(ctx, proto.StreamLogs)
			if err != nil {
				return err
			}
			if _, err := s.GetLastMsgForSubject(ctx, proto.LogSubject("job-1", 1)); err != nil {
				return err
			}
			oc, err := c.js.OrderedConsumer(ctx, proto.StreamLogs, jetstream.OrderedConsumerConfig{FilterSubjects: []string{proto.LogSubject("job-1", 1)}})
			if err != nil {
				return err
			}
			_, err = oc.Next(jetstream.FetchContext(ctx))
			return err
		})
	}
	// The notifier reads a job by sequence, dead-letters and deletes it.
	nt.call(t, "notifier dead-letters", func(ctx context.Context) error {
		if _, err := nt.js.CreateOrUpdateConsumer(ctx, proto.StreamAdvisories, proto.NotifierConsumer(-1, 30*time.Second)); err != nil {
			return err
		}
		s, err := nt.js.Stream(ctx, proto.StreamJobs)
		if err != nil {
			return err
		}
		raw, err := s.GetMsg(ctx, 2)
		if err != nil {
			return err
		}
		if _, err := nt.js.Publish(ctx, proto.DLQSubject("acme", proto.KindFix), raw.Data); err != nil {
			return err
		}
		if err := s.DeleteMsg(ctx, raw.Sequence); err != nil {
			return err
		}
		if _, err := nt.js.Consumer(ctx, proto.StreamJobs, proto.ConsumerRunner); err != nil {
			return err
		}
		wb, err := nt.js.KeyValue(ctx, proto.BucketWriteback)
		if err != nil {
			return err
		}
		_, err = wb.Put(ctx, "job-1", []byte(`{}`))
		return err
	})
	// The gateway reads the DLQ for a retry and the queue figures.
	gw.call(t, "gateway reads the DLQ", func(ctx context.Context) error {
		s, err := gw.js.Stream(ctx, proto.StreamDLQ)
		if err != nil {
			return err
		}
		if _, err := s.GetMsg(ctx, 1); err != nil {
			return err
		}
		if _, err := gw.js.Consumer(ctx, proto.StreamJobs, proto.ConsumerRunner); err != nil {
			return err
		}
		kv, err := gw.js.KeyValue(ctx, proto.BucketUISessions)
		if err != nil {
			return err
		}
		_, err = kv.Create(ctx, "session.abc", []byte(`{}`))
		return err
	})
	// The runner saves, restores and deletes a task's state.
	rn.call(t, "runner saves and restores a task state", func(ctx context.Context) error {
		obs, err := rn.js.ObjectStore(ctx, proto.ObjectStoreTaskState)
		if err != nil {
			return err
		}
		for range 2 { // the second save replaces the first
			if _, err := obs.PutBytes(ctx, proto.TaskStateKey("acme", "t1"), []byte("state")); err != nil {
				return err
			}
		}
		if _, err := obs.GetBytes(ctx, proto.TaskStateKey("acme", "t1")); err != nil {
			return err
		}
		return obs.Delete(ctx, proto.TaskStateKey("acme", "t1"))
	})
	// The gateway updates the topology when its configuration changes.
	gw.call(t, "gateway updates the topology", func(ctx context.Context) error {
		_, err := proto.Topology{StatusTTL: 2 * proto.StatusTTLDefault}.Ensure(ctx, gw.js)
		return err
	})
	_ = topo
}

// TestServicesCannotOverreach: what each user must not do, each refused
// by the server with a permission violation.
func TestServicesCannotOverreach(t *testing.T) {
	cs := setup(t)
	gw, rn, nt := cs[natsauth.Gateway], cs[natsauth.Runner], cs[natsauth.Notifier]
	kvGet := func(c *client, bucket string) func(context.Context) error {
		return func(ctx context.Context) error {
			// The bucket's stream info is refused already; a direct get
			// by hand is the read itself.
			_, err := c.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+bucket+".$KV."+bucket+".job-1", nil)
			return err
		}
	}

	t.Run("nobody but admin deletes or purges a stream", func(t *testing.T) {
		for _, c := range []*client{gw, rn, nt} {
			for _, s := range []string{proto.StreamJobs, proto.StreamDLQ, "KV_" + proto.BucketJobs, "KV_" + proto.BucketWriteback} {
				c.denied(t, "$JS.API.STREAM.DELETE."+s, func(ctx context.Context) error { return c.js.DeleteStream(ctx, s) })
				c.denied(t, "$JS.API.STREAM.PURGE."+s, func(ctx context.Context) error {
					_, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+s, nil)
					return err
				})
			}
		}
		admin := cs[natsauth.Admin]
		admin.call(t, "admin deletes JOBS_DLQ", func(ctx context.Context) error { return admin.js.DeleteStream(ctx, proto.StreamDLQ) })
	})
	t.Run("gateway cannot read the notifier's writeback bucket", func(t *testing.T) {
		gw.denied(t, "$JS.API.DIRECT.GET.KV_writeback.$KV.writeback.job-1", kvGet(gw, proto.BucketWriteback))
		gw.denied(t, "$JS.API.STREAM.INFO.KV_writeback", func(ctx context.Context) error {
			_, err := gw.js.KeyValue(ctx, proto.BucketWriteback)
			return err
		})
	})
	t.Run("runner cannot read or change what is not its own", func(t *testing.T) {
		rn.denied(t, "$JS.API.DIRECT.GET.KV_ui_sessions.$KV.ui_sessions.job-1", kvGet(rn, proto.BucketUISessions))
		rn.denied(t, "$JS.API.DIRECT.GET.KV_writeback.$KV.writeback.job-1", kvGet(rn, proto.BucketWriteback))
		rn.denied(t, "$KV.ui_sessions.session.x", func(ctx context.Context) error {
			_, err := rn.js.Publish(ctx, "$KV.ui_sessions.session.x", []byte(`{}`))
			return err
		})
		// A stream update may add sources, copying another stream in.
		rn.denied(t, "$JS.API.STREAM.UPDATE.JOBS_LOGS", func(ctx context.Context) error {
			cfg := proto.Topology{}.LogsStream()
			cfg.Sources = []*jetstream.StreamSource{{Name: "KV_" + proto.BucketUISessions}}
			_, err := rn.js.UpdateStream(ctx, cfg)
			return err
		})
		rn.denied(t, "$JS.API.STREAM.UPDATE.KV_task_locks", func(ctx context.Context) error {
			_, err := rn.js.UpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: proto.BucketTaskLocks, History: 5})
			return err
		})
		rn.denied(t, "dlq.acme.fix", func(ctx context.Context) error {
			_, err := rn.js.Publish(ctx, proto.DLQSubject("acme", proto.KindFix), []byte(`{}`))
			return err
		})
		rn.denied(t, "$JS.API.CONSUMER.MSG.NEXT.JOBS_ADVISORIES.notifier", func(ctx context.Context) error {
			_, err := rn.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT.JOBS_ADVISORIES.notifier", []byte(`{"batch":1}`))
			return err
		})
		rn.denied(t, "$JS.API.STREAM.MSG.DELETE.JOBS", func(ctx context.Context) error {
			s, err := rn.js.Stream(ctx, proto.StreamJobs)
			if err != nil {
				return err
			}
			return s.DeleteMsg(ctx, 1)
		})
		rn.denied(t, "$JS.API.STREAM.CREATE.EXFIL", func(ctx context.Context) error {
			_, err := rn.js.CreateStream(ctx, jetstream.StreamConfig{Name: "EXFIL", Sources: []*jetstream.StreamSource{{Name: "KV_" + proto.BucketUISessions}}})
			return err
		})
	})
	// The notifier alone may publish one, to stand in for an advisory
	// JetStream lost (its sweep).
	t.Run("nobody else forges an advisory", func(t *testing.T) {
		subj := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.JOBS.runner"
		for _, c := range []*client{gw, rn} {
			c.denied(t, subj, func(ctx context.Context) error {
				if err := c.nc.Publish(subj, []byte(`{}`)); err != nil {
					return err
				}
				<-ctx.Done() // denied ends this call at the violation
				return ctx.Err()
			})
		}
	})
	t.Run("nobody reads another's replies", func(t *testing.T) {
		for _, subj := range []string{"_INBOX.>", natsauth.InboxPrefix(natsauth.Gateway) + ".>"} {
			rn.denied(t, subj, func(ctx context.Context) error {
				sub, err := rn.nc.SubscribeSync(subj)
				if err != nil {
					return err
				}
				defer func() { _ = sub.Unsubscribe() }()
				if err := rn.nc.Flush(); err != nil {
					return err
				}
				// The violation arrives asynchronously; denied ends this
				// call when it has.
				<-ctx.Done()
				return ctx.Err()
			})
		}
	})
}

// An object store is one grant: its owner puts, reads, replaces and
// deletes objects; a reader reads them and cannot write.
func TestObjectStoreGrant(t *testing.T) {
	const store = "state_test"
	info := natsauth.Publish("$JS.API.INFO", "account info")
	perms := map[string]natsauth.Permissions{
		natsauth.Runner:  natsauth.Compile(natsauth.Runner, info, natsauth.ObjectStore(store, natsauth.Own)),
		natsauth.Gateway: natsauth.Compile(natsauth.Gateway, info, natsauth.ObjectStore(store, natsauth.Info|natsauth.Get|natsauth.Read)),
	}
	var users []*natsserver.User
	for name, p := range perms {
		users = append(users, &natsserver.User{Username: name, Password: "pw-" + name, Permissions: &natsserver.Permissions{
			Publish: &natsserver.SubjectPermission{Allow: p.Publish}, Subscribe: &natsserver.SubjectPermission{Allow: p.Subscribe}}})
	}
	s, err := embedded.Start(embedded.Options{Port: -1, StoreDir: t.TempDir(), Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	rn, gw := login(t, s, natsauth.Runner), login(t, s, natsauth.Gateway)
	rn.call(t, "runner writes", func(ctx context.Context) error {
		obs, err := rn.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: store})
		if err != nil {
			return err
		}
		for range 2 { // the second put replaces the first
			if _, err := obs.PutBytes(ctx, "acme.t1", []byte("bundle")); err != nil {
				return err
			}
		}
		if _, err := obs.GetBytes(ctx, "acme.t1"); err != nil {
			return err
		}
		if _, err := obs.PutBytes(ctx, "acme.t2", []byte("x")); err != nil {
			return err
		}
		return obs.Delete(ctx, "acme.t2")
	})
	gw.call(t, "gateway reads", func(ctx context.Context) error {
		obs, err := gw.js.ObjectStore(ctx, store)
		if err != nil {
			return err
		}
		b, err := obs.GetBytes(ctx, "acme.t1")
		if err == nil && string(b) != "bundle" {
			err = fmt.Errorf("read %q", b)
		}
		return err
	})
	gw.deniedPrefix(t, "$O."+store+".C.", func(ctx context.Context) error {
		obs, err := gw.js.ObjectStore(ctx, store)
		if err != nil {
			return err
		}
		_, err = obs.PutBytes(ctx, "acme.t3", []byte("forged"))
		return err
	})
}
