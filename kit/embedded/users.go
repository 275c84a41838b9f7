package embedded

import (
	"fmt"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/orch-dev/orch/kit/natsauth"
)

// Users returns natsauth's users for an in-process nats-server
// (Options.Users), each with its password from passwords, which must name
// every user of natsauth.Users. It lives here, not in natsauth, so that
// the services, which import natsauth, do not link nats-server.
func Users(passwords map[string]string) ([]*server.User, error) {
	var users []*server.User
	for _, name := range natsauth.Users() {
		pw := passwords[name]
		if pw == "" {
			return nil, fmt.Errorf("no NATS password for user %s", name)
		}
		users = append(users, &server.User{Username: name, Password: pw, Permissions: Permissions(name)})
	}
	return users, nil
}

// Permissions is natsauth.For(user) as nats-server takes it.
func Permissions(user string) *server.Permissions {
	p := natsauth.For(user)
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Publish},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe},
	}
}
