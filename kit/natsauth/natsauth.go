// Package natsauth is who may do what on orch's NATS: one user per
// service, each allowed only the subjects and JetStream API calls that
// service makes, and an admin user for operators and the nats CLI.
//
// The table (grants) is the one place these permissions are written.
// `make run`'s embedded server is configured from it (kit/embedded.Users), and
// deployments/check holds every shipped nats-server config to it, so a
// permission added here and not there fails a test.
//
// JetStream's API is subjects, so a permission is a publish allow list:
// $JS.API.STREAM.CREATE.JOBS creates (or confirms) the stream JOBS,
// $KV.jobs.> writes the bucket jobs, and so on. Replies come back on the
// service's own inbox prefix (InboxPrefix), the only subjects it may
// subscribe to: one service's user cannot read another's replies (a KV
// get answered to the gateway, say), which a shared _INBOX.> would allow.
//
// Who may change a stream's configuration matters beyond that stream: a
// stream update may add sources, and a stream that sources another copies
// its messages. So only the gateway, which ensures the topology, updates
// it, and the notifier updates only its own writeback bucket; the runner,
// which runs agents, may create a stream that is missing (the same
// configuration every service ensures) but never update one. No service
// may delete or purge a stream: that is the admin's.
package natsauth

import (
	"fmt"
	"slices"

	"github.com/orch-dev/orch/proto"
)

// The users: one per service, and the operators'.
const (
	Gateway  = "gateway"
	Runner   = "runner"
	Notifier = "notifier"
	// Admin may do anything: the nats CLI, backups, deleting a stream.
	Admin = "admin"
)

// Users lists every user of the table: the three services, then Admin.
func Users() []string { return []string{Gateway, Runner, Notifier, Admin} }

// InboxPrefix is the inbox prefix of a service's connection
// (nats.CustomInboxPrefix): its replies arrive under InboxPrefix(user)+".",
// which only that user may subscribe to.
func InboxPrefix(user string) string { return "_INBOX_" + user }

// Permissions are allow lists: a subject that no entry matches is denied.
type Permissions struct {
	Publish   []string
	Subscribe []string
}

// For returns user's permissions. Admin's allow everything; an unknown
// user gets none.
func For(user string) Permissions {
	if user == Admin {
		return Permissions{Publish: []string{">"}, Subscribe: []string{">"}}
	}
	gs, ok := grants[user]
	if !ok {
		return Permissions{}
	}
	return Compile(user, gs...)
}

// Compile is the permissions of grants for user: what they allow to
// publish, sorted, and user's inbox to subscribe to. For compiles the
// table; tests compile a line they try out.
func Compile(user string, grants ...Grant) Permissions {
	var p Permissions
	for _, g := range grants {
		p.Publish = append(p.Publish, g.publish...)
	}
	slices.Sort(p.Publish)
	p.Publish = slices.Compact(p.Publish)
	p.Subscribe = []string{InboxPrefix(user) + ".>"}
	return p
}

// A Grant is one line of the table: what it is for and the subjects it
// lets a user publish to.
type Grant struct {
	What    string
	publish []string
}

// Grants returns the lines of user's table, for docs and tests.
func Grants(user string) []Grant { return slices.Clone(grants[user]) }

// Subjects returns the subjects g allows publishing to.
func (g Grant) Subjects() []string { return slices.Clone(g.publish) }

// Access says what a user may do with a stream or bucket; the values
// combine with |.
type Access uint

const (
	// Info reads a stream's configuration and state (STREAM.INFO).
	Info Access = 1 << iota
	// Create creates the stream when it is missing, or confirms that it
	// exists as configured (STREAM.CREATE is idempotent).
	Create
	// Update changes its configuration: only for the stream's owner.
	Update
	// Get reads one message by sequence or the last of a subject
	// (STREAM.MSG.GET, DIRECT.GET).
	Get
	// Read reads the stream through ephemeral ordered consumers: KV
	// watches, a job's log.
	Read
	// Write publishes to the bucket's subjects: put, create, update,
	// delete of a key.
	Write
	// DeleteMsg removes one message by sequence (STREAM.MSG.DELETE).
	DeleteMsg
)

// Ensure is what a service that ensures a stream at start needs: read it,
// create it when missing.
const Ensure = Info | Create

// Own is everything but deleting and purging: the bucket's owner.
const Own = Ensure | Update | Get | Read | Write

// api is a JetStream API subject.
func api(format string, a ...any) string { return "$JS.API." + fmt.Sprintf(format, a...) }

// Stream grants access to a stream.
func Stream(name string, a Access) Grant {
	var p []string
	if a&Info != 0 {
		p = append(p, api("STREAM.INFO.%s", name))
	}
	if a&Create != 0 {
		p = append(p, api("STREAM.CREATE.%s", name))
	}
	if a&Update != 0 {
		p = append(p, api("STREAM.UPDATE.%s", name))
	}
	if a&Get != 0 {
		p = append(p, api("STREAM.MSG.GET.%s", name), api("DIRECT.GET.%s", name), api("DIRECT.GET.%s.>", name))
	}
	if a&Read != 0 {
		// An ordered consumer: created with or without a filter subject,
		// fetched from, deleted when done; push consumers (KV watches)
		// answer flow control on $JS.FC.
		p = append(p, api("CONSUMER.CREATE.%s", name), api("CONSUMER.CREATE.%s.>", name),
			api("CONSUMER.INFO.%s.*", name), api("CONSUMER.MSG.NEXT.%s.*", name), api("CONSUMER.DELETE.%s.*", name),
			"$JS.FC."+name+".>")
	}
	if a&DeleteMsg != 0 {
		p = append(p, api("STREAM.MSG.DELETE.%s", name))
	}
	return Grant{What: fmt.Sprintf("stream %s: %s", name, a), publish: p}
}

// Bucket grants access to the KV bucket name (stream KV_<name>, subjects
// $KV.<name>.>).
func Bucket(name string, a Access) Grant {
	g := Stream("KV_"+name, a&^Write)
	if a&Write != 0 {
		g.publish = append(g.publish, "$KV."+name+".>")
	}
	g.What = fmt.Sprintf("KV bucket %s: %s", name, a)
	return g
}

// ObjectStore grants access to the object store name (stream OBJ_<name>,
// subjects $O.<name>.>): Write puts and deletes objects (a put or delete
// purges the object's old chunks, so it purges that stream), Read and Get
// read them.
func ObjectStore(name string, a Access) Grant {
	g := Stream("OBJ_"+name, a&^Write)
	if a&Write != 0 {
		g.publish = append(g.publish, "$O."+name+".>", api("STREAM.PURGE.%s", "OBJ_"+name))
	}
	g.What = fmt.Sprintf("object store %s: %s", name, a)
	return g
}

// Consume grants pulling from and acking on the durable consumer of a
// stream, and creating or updating it.
func Consume(stream, consumer string) Grant {
	return Grant{What: fmt.Sprintf("consumer %s on %s: pull and ack", consumer, stream), publish: []string{
		api("CONSUMER.CREATE.%s.%s", stream, consumer), api("CONSUMER.CREATE.%s.%s.>", stream, consumer),
		api("CONSUMER.DURABLE.CREATE.%s.%s", stream, consumer), api("CONSUMER.INFO.%s.%s", stream, consumer),
		api("CONSUMER.MSG.NEXT.%s.%s", stream, consumer), "$JS.ACK." + stream + "." + consumer + ".>",
	}}
}

// ConsumerInfo grants reading a consumer's state (pending, ack pending).
func ConsumerInfo(stream, consumer string) Grant {
	return Grant{What: fmt.Sprintf("consumer %s on %s: info", consumer, stream),
		publish: []string{api("CONSUMER.INFO.%s.%s", stream, consumer)}}
}

// Publish grants publishing messages to subject (a pattern), for what.
func Publish(subject, what string) Grant {
	return Grant{What: "publish " + subject + ": " + what, publish: []string{subject}}
}

// Topology grants a on every stream and bucket proto.Topology.Ensure
// makes, which every service ensures at start.
func Topology(a Access) []Grant {
	var t proto.Topology
	var gs []Grant
	for _, c := range []string{t.JobsStream().Name, t.AdvisoriesStream().Name, t.DLQStream().Name, t.LogsStream().Name, proto.StreamTaskState} {
		gs = append(gs, Stream(c, a))
	}
	for _, c := range []string{t.JobsBucket().Bucket, t.TaskLocksBucket().Bucket, t.PausesBucket().Bucket, t.SpendBucket().Bucket} {
		gs = append(gs, Bucket(c, a))
	}
	return gs
}

// String names the access bits, for the table in docs/deploy.md.
func (a Access) String() string {
	var s []string
	for _, n := range []struct {
		a    Access
		name string
	}{{Info, "info"}, {Create, "create"}, {Update, "update"}, {Get, "get"}, {Read, "read"}, {Write, "write"}, {DeleteMsg, "delete message"}} {
		if a&n.a != 0 {
			s = append(s, n.name)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	out := s[0]
	for _, x := range s[1:] {
		out += ", " + x
	}
	return out
}
