package sshserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// directReq is the payload of a "direct-tcpip" channel open (RFC 4254 7.2).
type directReq struct {
	Host       string
	Port       uint32
	OriginHost string
	OriginPort uint32
}

// dialTimeout bounds dialing a direct-tcpip target.
const dialTimeout = 5 * time.Second

// directTCPIP serves ssh -L: a TCP connection to one of the machine's own addresses.
func (s *Server) directTCPIP(ctx context.Context, nch ssh.NewChannel, log *slog.Logger) {
	var d directReq
	if err := ssh.Unmarshal(nch.ExtraData(), &d); err != nil || d.Port == 0 || d.Port > 65535 {
		nch.Reject(ssh.ConnectionFailed, "bad direct-tcpip request")
		return
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	c, err := s.o.Dial(dctx, d.Host, int(d.Port))
	cancel()
	if err != nil {
		log.Info("ssh forward refused", "host", d.Host, "port", d.Port, "err", err)
		nch.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	ch, reqs, err := nch.Accept()
	if err != nil {
		c.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	log.Info("ssh forward opened", "host", d.Host, "port", d.Port)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		io.Copy(c, ch)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	go func() {
		defer wg.Done()
		io.Copy(ch, c)
		ch.CloseWrite()
	}()
	stop := context.AfterFunc(ctx, func() { c.Close(); ch.Close() })
	wg.Wait()
	stop()
	c.Close()
	ch.Close()
}

// Local says whether host names one of this machine's own addresses: "localhost", a loopback
// address, or an address of one of its interfaces. Names other than localhost are not
// resolved (a name could point anywhere).
func Local(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// dialLocal is the default Options.Dial: the machine's own addresses only.
func dialLocal(ctx context.Context, host string, port int) (net.Conn, error) {
	if !Local(host) {
		return nil, fmt.Errorf("ssh -L to %s: only this machine's own addresses (localhost, loopback, its interfaces) may be reached", host)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("connect to %s port %d: %w", host, port, err)
	}
	return c, nil
}
