package natsauth

import (
	"fmt"
	"strings"
)

// PasswordVar is the environment variable a shipped nats-server config
// reads user's password from: NATS_GATEWAY_PASSWORD and so on.
func PasswordVar(user string) string { return "NATS_" + strings.ToUpper(user) + "_PASSWORD" }

// Config renders the table as a nats-server configuration block, each
// password read from the environment variable PasswordVar(user). It is
// what deployments/nats/users.conf holds.
func Config() string {
	var b strings.Builder
	b.WriteString("authorization {\n  users = [\n")
	for _, name := range Users() {
		p := For(name)
		fmt.Fprintf(&b, "    {\n      user: %s\n      password: $%s\n      permissions: {\n", name, PasswordVar(name))
		list := func(kind string, subjects []string) {
			fmt.Fprintf(&b, "        %s: {allow: [\n", kind)
			for _, s := range subjects {
				fmt.Fprintf(&b, "          %q\n", s)
			}
			b.WriteString("        ]}\n")
		}
		list("publish", p.Publish)
		list("subscribe", p.Subscribe)
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}
