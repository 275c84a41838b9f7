package service

import (
	"fmt"
	"io"
	"net/http"
	"time"
)

// HealthcheckTimeout bounds the whole request of -healthcheck; a
// container runtime gives up on its own after the health check's timeout
// (5s in the shipped compose file), so this stays below it.
const HealthcheckTimeout = 4 * time.Second

// Healthcheck GETs url and reports an error unless the answer is 2xx,
// naming the status and the start of the body (what /readyz says is not
// ready).
func Healthcheck(url string, timeout time.Duration) error {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	return nil
}
