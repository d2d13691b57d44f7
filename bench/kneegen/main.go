// kneegen: upf-loadgen's `run` at one rate, in Go, for finding the all-in-one's knee on a small host.
//
// Why: on the bench's two cores the Python load generator spends about as much CPU per publish and
// delivery as the server does, so every sweep up to 10,000/s ended with loadgen's offered rate
// falling behind, never the server's (issue 9's scaling figure stayed a lower bound). This does the
// same work for a fraction of a core: one ws subscriber per topic, one publisher per topic that
// awaits each publish before its next (so commit order is seq order) on an open-loop schedule, the
// same bodies as loadgen ("lg:<seq>:<sent ns>:" and a seq-rotated pad), and the same checks per
// topic: every accepted publish delivered once, in order, byte for byte. Standard library only.
//
//	kneegen -writer http://127.0.0.1:8080 -pusher http://127.0.0.1:8080 -topics 1000 -rate 12000 -duration 6
//
// It prints one JSON object (see report) on stdout; progress and errors go to stderr: the lines
// "kneegen: publishing" (subscribers are in; publishing starts within 50 ms) and "kneegen: drained"
// (every accepted publish delivered, or the drain timed out) bound the window a caller prices the
// server's CPU over, without the subscribers' connects.
package main

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const pad = "abcdefghijklmnopqrstuvwxyz0123456789"

var base = time.Now()

func nowNs() int64 { return int64(time.Since(base)) }

// body is loadgen's text payload (loadgen/src/upf_loadgen/wire.py encode_payload).
func body(seq int, sentNs int64, size int) []byte {
	head := "lg:" + strconv.Itoa(seq) + ":" + strconv.FormatInt(sentNs, 10) + ":"
	b := make([]byte, 0, max(size, len(head)))
	b = append(b, head...)
	for i, start := 0, seq%len(pad); len(b) < size; i++ {
		b = append(b, pad[(start+i)%len(pad)])
	}
	return b
}

type topicState struct {
	name     string
	accepted []int // seqs answered 200, in order
	received []int // seqs delivered, in arrival order
	mu       sync.Mutex
}

type report struct {
	Rate          float64          `json:"rate"`
	Secs          float64          `json:"secs"`
	Topics        int              `json:"topics"`
	OfferedPerS   float64          `json:"offered_per_s"`
	AcceptedPerS  float64          `json:"accepted_per_s"`
	DeliveredPerS float64          `json:"delivered_per_s"`
	P50Ms         float64          `json:"p50_ms"`
	P99Ms         float64          `json:"p99_ms"`
	PublishP99Ms  float64          `json:"publish_p99_ms"`
	Violations    map[string]int   `json:"violations"`
	Errors        map[string]int64 `json:"errors"`
	CPUSecs       float64          `json:"cpu_secs"`
	Undelivered   int              `json:"undelivered"`
	Samples       []string         `json:"samples"`
}

type counters struct {
	offered, accepted, delivered, timeouts, connErrs, statusErrs, corrupt atomic.Int64
}

var (
	samplesMu sync.Mutex
	samples   []string
)

func sample(s string) {
	samplesMu.Lock()
	if len(samples) < 5 {
		samples = append(samples, s)
	}
	samplesMu.Unlock()
}

// --- publishing: raw HTTP/1.1 keep-alive connections in a pool ------------------------------------

type pubConn struct {
	c net.Conn
	r *bufio.Reader
}

type pool struct {
	addr, host string
	free       chan *pubConn
	slots      chan struct{}
}

func (p *pool) get() (*pubConn, error) {
	select {
	case c := <-p.free:
		return c, nil
	default:
	}
	select {
	case c := <-p.free:
		return c, nil
	case p.slots <- struct{}{}:
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			<-p.slots
			return nil, err
		}
		return &pubConn{c: c, r: bufio.NewReaderSize(c, 4096)}, nil
	}
}

func (p *pool) put(c *pubConn, ok bool) {
	if !ok {
		c.c.Close()
		<-p.slots
		return
	}
	p.free <- c
}

// post sends one publish and returns the status; the connection is reusable if err is nil.
func (c *pubConn) post(host, path string, b []byte, timeout time.Duration) (int, error) {
	c.c.SetDeadline(time.Now().Add(timeout))
	req := make([]byte, 0, 160+len(b))
	req = append(req, "POST "...)
	req = append(req, path...)
	req = append(req, " HTTP/1.1\r\nHost: "...)
	req = append(req, host...)
	req = append(req, "\r\nContent-Type: text/plain\r\nContent-Length: "...)
	req = strconv.AppendInt(req, int64(len(b)), 10)
	req = append(req, "\r\n\r\n"...)
	req = append(req, b...)
	if _, err := c.c.Write(req); err != nil {
		return 0, err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 || !strings.HasPrefix(string(line), "HTTP/1.1 ") {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, err
	}
	length, closeAfter := -1, false
	for {
		h, err := c.r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(h) <= 2 {
			break
		}
		k, v, _ := strings.Cut(strings.TrimSpace(string(h)), ":")
		switch strings.ToLower(k) {
		case "content-length":
			length, _ = strconv.Atoi(strings.TrimSpace(v))
		case "connection":
			closeAfter = strings.EqualFold(strings.TrimSpace(v), "close")
		}
	}
	if length < 0 {
		return 0, errors.New("reply without content-length")
	}
	if _, err := c.r.Discard(length); err != nil {
		return 0, err
	}
	if closeAfter {
		return status, errors.New("server closed the connection")
	}
	return status, nil
}

// --- subscribing: one ws connection per topic ----------------------------------------------------

type wsConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialWS(addr, host, path string) (*wsConn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	key := make([]byte, 16)
	rand.Read(key)
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", path, host, base64.StdEncoding.EncodeToString(key))
	r := bufio.NewReaderSize(c, 4096)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := r.ReadString('\n')
	if err != nil || !strings.Contains(line, " 101 ") {
		c.Close()
		return nil, fmt.Errorf("ws handshake: %q %v", line, err)
	}
	for {
		h, err := r.ReadString('\n')
		if err != nil {
			c.Close()
			return nil, err
		}
		if h == "\r\n" {
			break
		}
	}
	c.SetReadDeadline(time.Time{})
	return &wsConn{c: c, r: r}, nil
}

// next returns the next text message (pings answered, fragments joined); io.EOF on close.
func (w *wsConn) next(buf []byte) ([]byte, error) {
	msg := buf[:0]
	for {
		var h [2]byte
		if _, err := io.ReadFull(w.r, h[:]); err != nil {
			return nil, err
		}
		fin, op := h[0]&0x80 != 0, h[0]&0x0f
		n := int64(h[1] & 0x7f)
		switch n {
		case 126:
			var e [2]byte
			if _, err := io.ReadFull(w.r, e[:]); err != nil {
				return nil, err
			}
			n = int64(binary.BigEndian.Uint16(e[:]))
		case 127:
			var e [8]byte
			if _, err := io.ReadFull(w.r, e[:]); err != nil {
				return nil, err
			}
			n = int64(binary.BigEndian.Uint64(e[:]))
		}
		if h[1]&0x80 != 0 {
			return nil, errors.New("masked frame from the server")
		}
		start := len(msg)
		msg = slices.Grow(msg, int(n))[:start+int(n)]
		if _, err := io.ReadFull(w.r, msg[start:]); err != nil {
			return nil, err
		}
		switch op {
		case 0x8:
			return nil, io.EOF
		case 0x9: // ping: a masked pong with the same payload (the mask of zeros leaves it as is)
			pong := append([]byte{0x8a, 0x80 | byte(n), 0, 0, 0, 0}, msg[start:]...)
			w.c.Write(pong)
			msg = msg[:start]
			continue
		case 0xa:
			msg = msg[:start]
			continue
		}
		if fin {
			return msg, nil
		}
	}
}

type event struct {
	Event   string `json:"event"`
	Message string `json:"message"`
}

func main() {
	writer := flag.String("writer", "", "the writer's base URL")
	pusher := flag.String("pusher", "", "the pusher's base URL")
	topics := flag.Int("topics", 1000, "topics, one publisher and one ws subscriber each")
	rate := flag.Float64("rate", 1000, "publishes/s over all topics")
	secs := flag.Float64("duration", 6, "seconds of publishing")
	size := flag.Int("message-size", 200, "body bytes")
	prefix := flag.String("prefix", "kg", "topic name prefix")
	conns := flag.Int("connections", 0, "publish connections at most (0: one per topic, as publishers that are apart)")
	drain := flag.Float64("drain-timeout", 30, "seconds to wait for deliveries after publishing")
	timeout := flag.Float64("timeout", 10, "seconds a publish may take")
	flag.Parse()
	wu, err1 := url.Parse(*writer)
	pu, err2 := url.Parse(*pusher)
	if err1 != nil || err2 != nil || wu.Host == "" || pu.Host == "" || *topics < 1 || *rate <= 0 || *secs <= 0 {
		fmt.Fprintln(os.Stderr, "kneegen: -writer and -pusher URLs, -topics >= 1, -rate > 0 and -duration > 0 are needed")
		os.Exit(2)
	}

	var n counters
	states := make([]*topicState, *topics)
	for i := range states {
		states[i] = &topicState{name: fmt.Sprintf("%s%05d", *prefix, i)}
	}
	lat := make([][]int64, *topics) // publish-to-delivery ns, per topic (each written by its reader only)
	pubLat := make([][]int64, *topics)

	// Subscribers first, each confirmed by its open event.
	var ready, done sync.WaitGroup
	sem := make(chan struct{}, 64)
	var subErr atomic.Value
	wss := make([]*wsConn, *topics)
	for i, st := range states {
		ready.Add(1)
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			defer ready.Done()
			w, err := dialWS(pu.Host, pu.Host, "/"+st.name+"/ws")
			if err == nil {
				var m []byte
				if m, err = w.next(nil); err == nil && !strings.Contains(string(m), `"open"`) {
					err = fmt.Errorf("first frame %q", m)
				}
			}
			if err != nil {
				subErr.Store(err.Error())
				return
			}
			wss[i] = w
		}()
	}
	ready.Wait()
	if e := subErr.Load(); e != nil {
		fmt.Fprintln(os.Stderr, "kneegen: subscribe failed:", e)
		os.Exit(1)
	}
	for i, w := range wss {
		done.Add(1)
		go func() {
			defer done.Done()
			st := states[i]
			buf := make([]byte, 0, 1024)
			var ev event
			for {
				m, err := w.next(buf)
				if err != nil {
					return
				}
				got := nowNs()
				ev = event{}
				if json.Unmarshal(m, &ev) != nil || ev.Event != "message" {
					continue
				}
				parts := strings.SplitN(ev.Message, ":", 4)
				seq, e1 := strconv.Atoi(parts[min(1, len(parts)-1)])
				sent, e2 := strconv.ParseInt(parts[min(2, len(parts)-1)], 10, 64)
				if len(parts) != 4 || parts[0] != "lg" || e1 != nil || e2 != nil || string(body(seq, sent, *size)) != ev.Message {
					n.corrupt.Add(1)
					sample(st.name + ": a delivered body differs from what was sent")
					continue
				}
				lat[i] = append(lat[i], got-sent)
				st.mu.Lock()
				st.received = append(st.received, seq)
				st.mu.Unlock()
				n.delivered.Add(1)
			}
		}()
	}

	// Publishers: one per topic, each awaiting its publish, on an open-loop schedule. With a shared pool
	// smaller than the topics, the pool would bound the rate at (connections / publish latency) before the
	// server does: at 256 and the group commit's ~20 ms gather that is ~11,000/s.
	if *conns <= 0 {
		*conns = *topics
	}
	p := &pool{addr: wu.Host, host: wu.Host, free: make(chan *pubConn, *conns), slots: make(chan struct{}, *conns)}
	period := time.Duration(float64(*topics) / *rate * float64(time.Second))
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now().Add(50 * time.Millisecond)
	fmt.Fprintln(os.Stderr, "kneegen: publishing")
	end := start.Add(time.Duration(*secs * float64(time.Second)))
	var pubs sync.WaitGroup
	to := time.Duration(*timeout * float64(time.Second))
	for i, st := range states {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			phase := time.Duration(int64(period) * int64(i) / int64(*topics))
			path := "/" + st.name
			for seq := 0; ; seq++ {
				due := start.Add(phase + time.Duration(seq)*period)
				if !time.Now().Before(end) || !due.Before(end) {
					return
				}
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				sent := nowNs()
				b := body(seq, sent, *size)
				n.offered.Add(1)
				c, err := p.get()
				if err != nil {
					n.connErrs.Add(1)
					sample(st.name + ": " + err.Error())
					continue
				}
				status, err := c.post(p.host, path, b, to)
				p.put(c, err == nil)
				if err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						n.timeouts.Add(1)
					} else {
						n.connErrs.Add(1)
					}
					sample(st.name + ": " + err.Error())
					if status == 0 {
						continue
					}
				}
				pubLat[i] = append(pubLat[i], nowNs()-sent)
				if status != 200 {
					n.statusErrs.Add(1)
					sample(fmt.Sprintf("%s: HTTP %d", st.name, status))
					continue
				}
				n.accepted.Add(1)
				st.mu.Lock()
				st.accepted = append(st.accepted, seq)
				st.mu.Unlock()
			}
		}()
	}
	pubs.Wait()
	pubSecs := time.Since(start).Seconds()
	deadline := time.Now().Add(time.Duration(*drain * float64(time.Second)))
	for n.delivered.Load()+n.corrupt.Load() < n.accepted.Load() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintln(os.Stderr, "kneegen: drained")
	time.Sleep(200 * time.Millisecond) // a duplicate would come right after
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	for _, w := range wss {
		w.c.Close()
	}
	done.Wait()

	v := map[string]int{"lost": 0, "duplicate": 0, "reordered": 0, "corrupt": int(n.corrupt.Load())}
	undelivered := 0
	for _, st := range states {
		seen := make(map[int]int, len(st.received))
		prev := -1
		for _, s := range st.received {
			seen[s]++
			if seen[s] > 1 {
				v["duplicate"]++
			} else if s < prev {
				v["reordered"]++
			}
			prev = max(prev, s)
		}
		for _, s := range st.accepted {
			if seen[s] == 0 {
				v["lost"]++
				undelivered++
			}
		}
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pl := slices.Concat(pubLat...)
	slices.Sort(pl)
	q := func(xs []int64, f float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		return float64(xs[min(len(xs)-1, int(f*float64(len(xs))))]) / 1e6
	}
	cpu := func(r *syscall.Rusage) float64 {
		return float64(r.Utime.Sec+r.Stime.Sec) + float64(r.Utime.Usec+r.Stime.Usec)/1e6
	}
	out := report{
		Rate: *rate, Secs: pubSecs, Topics: *topics,
		OfferedPerS:   float64(n.offered.Load()) / pubSecs,
		AcceptedPerS:  float64(n.accepted.Load()) / pubSecs,
		DeliveredPerS: float64(n.delivered.Load()) / pubSecs,
		P50Ms:         q(all, 0.50), P99Ms: q(all, 0.99), PublishP99Ms: q(pl, 0.99),
		Violations: v,
		Errors: map[string]int64{
			"timeout": n.timeouts.Load(), "connection": n.connErrs.Load(), "status": n.statusErrs.Load(),
		},
		CPUSecs: cpu(&ru1) - cpu(&ru0), Undelivered: undelivered, Samples: samples,
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
