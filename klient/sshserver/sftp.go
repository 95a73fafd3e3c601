package sshserver

import (
	"errors"
	"fmt"
	"io"

	"github.com/pkg/sftp"
)

// ServeSFTP serves the sftp protocol on r and w until the client ends it: the body of the process
// Options.SFTP starts (klient re-executed as the account, so every file operation has the
// account's rights and nothing more).
func ServeSFTP(r io.Reader, w io.WriteCloser) error {
	srv, err := sftp.NewServer(struct {
		io.Reader
		io.WriteCloser
	}{r, w})
	if err != nil {
		return fmt.Errorf("sftp: %w", err)
	}
	if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("sftp: %w", err)
	}
	return nil
}
