package egress

import (
	"net/url"
	"strconv"
	"strings"
)

// NoProxy is the agent's NO_PROXY: the proxy's own address, which git's
// rewritten URLs and ANTHROPIC_BASE_URL point at, is reached directly.
const NoProxy = "127.0.0.1,localhost"

// AgentEnv is the environment the agent gets for this proxy, base being
// where it reaches it (http://127.0.0.1:<port>): the HTTP(S)_PROXY
// variables, ANTHROPIC_BASE_URL on /model, a placeholder for each model
// credential the runner holds, and git configuration (GIT_CONFIG_COUNT,
// which replaces any the base environment has) rewriting each git host's
// URLs to /git/ on the proxy, so git speaks plain HTTP to it and the
// proxy adds the credential.
func (p *Proxy) AgentEnv(base string) []string {
	base = strings.TrimSuffix(base, "/")
	if u, err := url.Parse(base); err == nil && u.Host != "" {
		p.self.Store(&u.Host)
	}
	env := []string{
		"HTTPS_PROXY=" + base, "HTTP_PROXY=" + base,
		"https_proxy=" + base, "http_proxy=" + base,
		"NO_PROXY=" + NoProxy, "no_proxy=" + NoProxy,
		"ANTHROPIC_BASE_URL=" + base + "/model",
	}
	if p.o.APIKey != "" {
		env = append(env, "ANTHROPIC_API_KEY="+PlaceholderAPIKey)
	}
	if p.o.OAuthToken != "" {
		env = append(env, "CLAUDE_CODE_OAUTH_TOKEN="+PlaceholderOAuthToken)
	}
	n := 0
	for _, g := range p.gitHostsSorted() {
		i := strconv.Itoa(n)
		env = append(env,
			"GIT_CONFIG_KEY_"+i+"=url."+base+"/git/"+g.key()+"/.insteadOf",
			"GIT_CONFIG_VALUE_"+i+"="+g.origin.String()+"/")
		n++
	}
	if n > 0 {
		env = append(env, "GIT_CONFIG_COUNT="+strconv.Itoa(n))
	}
	return env
}
