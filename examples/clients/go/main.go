// A Boxcar client in Go, written from docs/nats-api.md alone, with the official NATS client
// (nats.go) and the standard library: no Boxcar code. It talks to the dispatchers over the
// request/reply API as one user and follows its jobs on their event subjects.
//
// It discovers the dispatchers (as an admin), submits a job and follows it to its end, submits it again with
// the same idempotency key, reads the job's stored history, asks for an agent that does not
// exist, and cancels a job while it runs. It prints one JSON line per step, for people and for
// test/go-client.test.ts, which builds and runs it against a real Boxcar in CI.
//
//	go run . -nats nats://127.0.0.1:4222 -creds alice.creds -role submitter -user alice \
//	    -agent echo -slow-agent sleeper
//
// Against `boxcar up` without --auth, leave out -creds: every caller is then admin.local.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The final job states: a job in one of them changes no more (docs/nats-api.md, Job records).
var final = map[string]bool{
	"succeeded": true, "failed": true, "timed_out": true, "cancelled": true,
	"rejected": true, "expired": true, "dead": true,
}

// A reply envelope: {"ok": true, "data": ...} or {"ok": false, "error": {...}}.
type reply struct {
	OK    bool            `json:"ok"`
	Data  json.RawMessage `json:"data"`
	Error *apiError       `json:"error"`
}

type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  string `json:"-"` // the Nats-Service-Error-Code header
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

type job struct {
	ID     string          `json:"id"`
	Owner  string          `json:"owner"`
	State  string          `json:"state"`
	Result json.RawMessage `json:"result"`
}

type event struct {
	Kind  string `json:"kind"`
	Type  string `json:"type"`
	JobID string `json:"jobId"`
	State string `json:"state"`
}

type client struct {
	nc     *nats.Conn
	prefix string
	caller string // <role>.<user>
}

// call sends one request to an endpoint and decodes the reply's data into out.
func (c *client) call(endpoint string, body any, out any) error {
	payload, err := json.Marshal(body)
	if err != nil {
		return err
	}
	msg, err := c.nc.Request(c.prefix+".api."+c.caller+"."+endpoint, payload, 10*time.Second)
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) {
		return &apiError{Code: "unavailable", Message: "no dispatcher answers: " + err.Error()}
	}
	if err != nil {
		return err
	}
	var r reply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return fmt.Errorf("%s: reply is not JSON: %w", endpoint, err)
	}
	if !r.OK {
		if r.Error == nil {
			return fmt.Errorf("%s: an error reply without an error", endpoint)
		}
		r.Error.Status = msg.Header.Get("Nats-Service-Error-Code")
		return r.Error
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(r.Data, out)
}

// follow subscribes to the user's own job events before anything is submitted, so no event of
// a new job is missed; each job's events are handed out by job id.
type follower struct {
	events chan event
}

func (c *client) follow(user string) (*follower, error) {
	f := &follower{events: make(chan event, 256)}
	_, err := c.nc.Subscribe(c.prefix+".evt.job."+user+".>", func(m *nats.Msg) {
		var e event
		if json.Unmarshal(m.Data, &e) == nil {
			f.events <- e
		}
	})
	if err != nil {
		return nil, err
	}
	return f, c.nc.Flush()
}

// until reads the events of job id until want(event) is true; it returns the types seen.
func (f *follower) until(id string, want func(event) bool, timeout time.Duration) ([]string, error) {
	var types []string
	deadline := time.After(timeout)
	for {
		select {
		case e := <-f.events:
			if e.JobID != id {
				continue
			}
			types = append(types, e.Type)
			if want(e) {
				return types, nil
			}
		case <-deadline:
			return types, fmt.Errorf("job %s: no such event within %s (saw %v)", id, timeout, types)
		}
	}
}

func isFinal(e event) bool { return final[e.State] }

func report(step string, fields map[string]any) {
	fields["step"] = step
	line, _ := json.Marshal(fields)
	fmt.Println(string(line))
}

func main() {
	url := flag.String("nats", nats.DefaultURL, "NATS server URL(s), comma-separated")
	creds := flag.String("creds", "", "credentials file (leave out on a server without authentication)")
	prefix := flag.String("prefix", "boxcar", "the Boxcar system's prefix")
	role := flag.String("role", "admin", "who is asking: the role (admin on a server without authentication)")
	user := flag.String("user", "local", "who is asking: the user name")
	agent := flag.String("agent", "echo", "an agent that writes its input back as its output")
	slow := flag.String("slow-agent", "", "an agent that runs until cancelled (leave out to skip the cancel)")
	flag.Parse()
	if err := run(*url, *creds, *prefix, *role, *user, *agent, *slow); err != nil {
		fmt.Fprintln(os.Stderr, "go client:", err)
		os.Exit(1)
	}
}

func discover(nc *nats.Conn, prefix string) error {
	info, err := nc.Request("$SRV.INFO."+prefix+"-dispatcher", nil, 5*time.Second)
	if err != nil {
		return err
	}
	var service struct {
		Name      string `json:"name"`
		Endpoints []struct {
			Subject string `json:"subject"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(info.Data, &service); err != nil {
		return err
	}
	submit := ""
	for _, e := range service.Endpoints {
		if strings.HasSuffix(e.Subject, ".jobs.submit") {
			submit = e.Subject
		}
	}
	report("discover", map[string]any{"service": service.Name, "endpoints": len(service.Endpoints), "submit": submit})
	return nil
}

func run(url, creds, prefix, role, user, agent, slow string) error {
	opts := []nats.Option{nats.Name("boxcar-go-client")}
	if creds != "" {
		// With authentication on, a user may receive replies only on its own inboxes.
		opts = append(opts, nats.UserCredentials(creds), nats.CustomInboxPrefix("_INBOX."+user))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	c := &client{nc: nc, prefix: prefix, caller: role + "." + user}

	// Discover: the dispatchers are a NATS service named <prefix>-dispatcher. Only an admin may
	// publish on $SRV subjects (and everyone on a server without authentication).
	if role == "admin" {
		if err := discover(nc, prefix); err != nil {
			return fmt.Errorf("discover: %w", err)
		}
	}

	f, err := c.follow(user)
	if err != nil {
		return err
	}

	// Submit, follow to the end, read the record.
	key := fmt.Sprintf("go-client-%d", time.Now().UnixNano())
	spec := map[string]any{"agent": agent, "input": map[string]any{"from": "go"}, "idempotencyKey": key}
	var submitted struct {
		Job       job  `json:"job"`
		Duplicate bool `json:"duplicate"`
	}
	if err := c.call("jobs.submit", spec, &submitted); err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	types, err := f.until(submitted.Job.ID, isFinal, 60*time.Second)
	if err != nil {
		return err
	}
	var got struct {
		Job job `json:"job"`
	}
	if err := c.call("jobs.get", map[string]any{"id": submitted.Job.ID}, &got); err != nil {
		return fmt.Errorf("get: %w", err)
	}
	var result struct {
		Output json.RawMessage `json:"output"`
	}
	_ = json.Unmarshal(got.Job.Result, &result)
	report("submit", map[string]any{
		"id": got.Job.ID, "owner": got.Job.Owner, "state": got.Job.State,
		"output": result.Output, "events": types,
	})

	// The same key again: the same job, marked a duplicate.
	var again struct {
		Job       job  `json:"job"`
		Duplicate bool `json:"duplicate"`
	}
	if err := c.call("jobs.submit", spec, &again); err != nil {
		return fmt.Errorf("submit again: %w", err)
	}
	report("resubmit", map[string]any{"sameJob": again.Job.ID == submitted.Job.ID, "duplicate": again.Duplicate})

	// The stored history, page by page.
	stored := 0
	for after := 0; ; {
		var page struct {
			Events []event `json:"events"`
			Last   int     `json:"last"`
			More   bool    `json:"more"`
		}
		if err := c.call("jobs.events", map[string]any{"id": submitted.Job.ID, "after": after}, &page); err != nil {
			return fmt.Errorf("events: %w", err)
		}
		stored += len(page.Events)
		if !page.More {
			break
		}
		after = page.Last
	}
	report("history", map[string]any{"events": stored})

	// An error is a reply too: branch on its code.
	err = c.call("jobs.submit", map[string]any{"agent": "no-such-agent"}, nil)
	var refused *apiError
	if !errors.As(err, &refused) {
		return fmt.Errorf("a job for an unknown agent was not refused: %v", err)
	}
	report("refused", map[string]any{"code": refused.Code, "status": refused.Status})

	// Cancel a job while it runs.
	if slow != "" {
		var long struct {
			Job job `json:"job"`
		}
		if err := c.call("jobs.submit", map[string]any{"agent": slow}, &long); err != nil {
			return fmt.Errorf("submit %s: %w", slow, err)
		}
		if _, err := f.until(long.Job.ID, func(e event) bool { return e.Type == "started" || isFinal(e) }, 60*time.Second); err != nil {
			return err
		}
		if err := c.call("jobs.cancel", map[string]any{"id": long.Job.ID}, nil); err != nil {
			return fmt.Errorf("cancel: %w", err)
		}
		if _, err := f.until(long.Job.ID, isFinal, 60*time.Second); err != nil {
			return err
		}
		var ended struct {
			Job job `json:"job"`
		}
		if err := c.call("jobs.get", map[string]any{"id": long.Job.ID}, &ended); err != nil {
			return fmt.Errorf("get: %w", err)
		}
		report("cancel", map[string]any{"state": ended.Job.State})
	}
	return nil
}
