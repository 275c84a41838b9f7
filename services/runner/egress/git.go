package egress

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"

	"go.uber.org/zap"
)

// gitHost is one git origin the /git/ proxy serves.
type gitHost struct {
	scheme, host string // host as written, lowercased, with its port if it has one
	origin       *url.URL
	// creds are the credential-store entries for this origin, in the
	// file's order: the first whose path prefixes the request's is used.
	creds []credential
	// repos are the repository paths (owner/repo, no .git) requests may
	// go to; nil for the whole host.
	repos []string
}

// credential is one git-credential-store line.
type credential struct {
	path string // "" for the whole host
	auth string // the Authorization header value
}

// key is how a request's /git/<scheme>/<host>/ names a host.
func (g *gitHost) key() string { return g.scheme + "/" + g.host }

// target is the host:port, for the log.
func (g *gitHost) target() string {
	if g.origin.Port() != "" {
		return g.origin.Host
	}
	port := "443"
	if g.scheme == "http" {
		port = "80"
	}
	return net.JoinHostPort(g.origin.Hostname(), port)
}

// storeLine is one parsed git-credential-store line.
type storeLine struct {
	scheme, host, path, user, pass string
}

// readCredentials reads a git-credential-store file (one
// scheme://user:password@host[:port][/path] URL a line, user and password
// percent-encoded, and the host too as git writes it: a port's colon is
// %3a in a file `git credential-store` wrote); "" reads nothing. An unreadable file is an error; a
// line that is not such a URL is skipped, as git skips it (and not
// logged: it may hold a secret).
func readCredentials(path string) ([]storeLine, error) {
	if path == "" {
		return nil, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("egress: git credentials: %w", err)
	}
	var lines []storeLine
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		u, err := url.Parse(unescapeHost(strings.TrimSpace(sc.Text())))
		if err != nil || u.User == nil || u.Host == "" {
			continue
		}
		pass, _ := u.User.Password()
		lines = append(lines, storeLine{
			scheme: strings.ToLower(u.Scheme), host: strings.ToLower(u.Host),
			path: strings.Trim(u.Path, "/"), user: u.User.Username(), pass: pass,
		})
	}
	return lines, nil
}

// unescapeHost decodes the host of a credential-store line: git writes
// it percent-encoded (127.0.0.1%3a3000 for 127.0.0.1:3000), which
// url.Parse refuses in a host. A line it cannot decode is left as it is.
func unescapeHost(line string) string {
	scheme, rest, ok := strings.Cut(line, "://")
	if !ok {
		return line
	}
	authority, path, hasPath := strings.Cut(rest, "/")
	at := strings.LastIndexByte(authority, '@')
	host, err := url.PathUnescape(authority[at+1:])
	if err != nil || strings.ContainsAny(host, "/@") {
		return line
	}
	out := scheme + "://" + authority[:at+1] + host
	if hasPath {
		out += "/" + path
	}
	return out
}

// parseGitHosts reads the git hosts: scheme://host[:port] for a whole
// host, or a repository's clone URL (scheme://host/owner/repo[.git]) for
// that repository alone; several repositories of one host add up, and a
// whole-host entry wins. Each host gets the credentials the store holds
// for it.
func parseGitHosts(entries []string, store []storeLine) (map[string]*gitHost, error) {
	hosts := map[string]*gitHost{}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
			u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("egress: git host %q is not an http(s)://host[:port][/repository] URL", e)
		}
		if _, err := canonTarget(u.Host, "443"); err != nil {
			return nil, fmt.Errorf("egress: git host %q: %w", e, err)
		}
		repo := strings.TrimSuffix(strings.Trim(u.Path, "/"), ".git")
		if repo != "" && !cleanPath("/"+repo) {
			return nil, fmt.Errorf("egress: git host %q: the repository path has . or .. in it", e)
		}
		g := &gitHost{scheme: u.Scheme, host: strings.ToLower(u.Host)}
		if old, ok := hosts[g.key()]; ok {
			g = old
		} else {
			g.origin = &url.URL{Scheme: g.scheme, Host: g.host}
			for _, s := range store {
				if s.scheme == g.scheme && s.host == g.host {
					g.creds = append(g.creds, credential{path: s.path,
						auth: "Basic " + base64.StdEncoding.EncodeToString([]byte(s.user+":"+s.pass))})
				}
			}
			g.repos = []string{}
			hosts[g.key()] = g
		}
		switch {
		case repo == "":
			g.repos = nil // the whole host
		case g.repos != nil:
			g.repos = append(g.repos, repo)
		}
	}
	return hosts, nil
}

// serves says whether a request path (decoded, with its leading slash)
// is one this host's entry lets through: anything for a whole host, else
// only what lies under one of its repositories (owner/repo/... or
// owner/repo.git/..., case-insensitively as the forges match them).
func (g *gitHost) serves(path string) bool {
	if g.repos == nil {
		return true
	}
	p := strings.ToLower(strings.TrimPrefix(path, "/"))
	for _, r := range g.repos {
		r = strings.ToLower(r)
		if strings.HasPrefix(p, r+"/") || strings.HasPrefix(p, r+".git/") {
			return true
		}
	}
	return false
}

// cleanPath says whether a path has no "." or ".." segment and no
// backslash, which a server might resolve to another repository.
func cleanPath(p string) bool {
	if strings.Contains(p, "\\") {
		return false
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// auth is the Authorization for a request to path on the host, "" when
// the store has none.
func (g *gitHost) auth(path string) string {
	path = strings.Trim(path, "/")
	for _, c := range g.creds {
		if c.path == "" || path == c.path || strings.HasPrefix(path, c.path+"/") {
			return c.auth
		}
	}
	return ""
}

// gitProxy serves /git/<scheme>/<host[:port]>/<path>: git in the sandbox
// speaks plain HTTP here (AgentEnv's insteadOf), and the request goes on
// to scheme://host/path over the real scheme with the runner's
// credential for that host, any the agent sent dropped.
func (p *Proxy) gitProxy(w http.ResponseWriter, r *http.Request) {
	escaped := strings.TrimPrefix(r.URL.EscapedPath(), "/git/")
	scheme, rest, _ := strings.Cut(escaped, "/")
	host, rest, _ := strings.Cut(rest, "/")
	g, ok := p.git[strings.ToLower(scheme)+"/"+strings.ToLower(host)]
	if !ok {
		defPort := "443"
		if scheme == "http" {
			defPort = "80"
		}
		target := quoteTarget(host)
		if t, err := canonTarget(host, defPort); err == nil {
			target = t
		}
		p.refuse(w, http.StatusForbidden, target, "not a git host of this project")
		return
	}
	out, err := url.Parse(g.origin.String() + "/" + rest)
	lower := strings.ToLower(rest)
	if err != nil || strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") || !cleanPath(out.Path) {
		p.refuse(w, http.StatusBadRequest, g.target(), "a git path with an encoded slash, . or .. in it")
		return
	}
	if !g.serves(out.Path) {
		p.refuse(w, http.StatusForbidden, g.target()+quoteTarget(out.Path), "not this project's repository")
		return
	}
	out.RawQuery = r.URL.RawQuery
	p.allowed(g.target(), "git")
	prefix := "/git/" + g.key()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = out
			pr.Out.Host = ""
			pr.Out.Header.Del("Authorization")
			if a := g.auth(out.Path); a != "" {
				pr.Out.Header.Set("Authorization", a)
			}
		},
		Transport:     p.upstream,
		FlushInterval: -1,
		ErrorLog:      p.errLog,
		// A redirect to the origin itself comes back through the proxy.
		ModifyResponse: func(resp *http.Response) error {
			if loc := resp.Header.Get("Location"); loc != "" {
				u, err := url.Parse(loc)
				if err != nil {
					return nil
				}
				same := strings.EqualFold(u.Scheme, g.scheme) && strings.EqualFold(u.Host, g.host)
				if same || (u.Scheme == "" && u.Host == "" && strings.HasPrefix(u.Path, "/")) {
					u.Scheme, u.Host = "", ""
					resp.Header.Set("Location", prefix+u.String())
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.log.Info("git request failed", zap.String("target", g.target()), zap.Error(err))
			http.Error(w, "orch egress proxy: reaching "+g.origin.String()+": "+err.Error(), http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}

// gitHostsSorted lists the git hosts in a stable order.
func (p *Proxy) gitHostsSorted() []*gitHost {
	keys := slices.Sorted(maps.Keys(p.git))
	hosts := make([]*gitHost, len(keys))
	for i, k := range keys {
		hosts[i] = p.git[k]
	}
	return hosts
}
