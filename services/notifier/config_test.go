package notifier

import (
	"testing"
	"time"

	"github.com/orch-dev/orch/kit/service"
)

func TestConfig(t *testing.T) {
	t.Parallel()
	var c Config
	c.SetDefaults()
	if c.TelegramRate != 1 || c.RetryDelay != 10*time.Second || c.RejectedDelay != 5*time.Minute || c.HTTPAddr != "" {
		t.Errorf("defaults: %+v", c)
	}
	// An explicit zero from the environment stands, through Run's
	// SetDefaults too; an unset variable takes its default.
	var z Config
	if err := service.Parse(&z, map[string]string{"ORCH_NOTIFY_RETRY_DELAY": "0"}); err != nil {
		t.Fatal(err)
	}
	z.SetDefaults()
	if z.RetryDelay != 0 || z.RetryMaxDelay != 5*time.Minute || z.TelegramRate != 1 || z.HTTPAddr != ":8082" {
		t.Errorf("ORCH_NOTIFY_RETRY_DELAY=0 gave %+v", z)
	}
	for _, bad := range []Config{
		{TelegramBotToken: "x"},
		{TelegramRate: -1},
		{TelegramRate: 0},
		{TelegramRate: 1, TelegramBotToken: "x", TelegramChatID: "1"},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil", bad)
		}
	}
}
