package kite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/kloud-dev/kloud/kite/frame"
)

// objectStream implements jsonrpc2.ObjectStream over a frame.Stream. It screens every frame before
// jsonrpc2 sees it: malformed JSON gets a -32700 reply, a frame that is not a JSON-RPC 2.0 request
// or response gets -32600, and in both cases the connection stays up (jsonrpc2 itself would
// drop the connection on any decode error).
type objectStream struct {
	ctx      context.Context
	frames   frame.Stream
	maxFrame int64
	wtimeout time.Duration
	// onReadErr runs once reading failed (jsonrpc2 then stops reading and closes).
	onReadErr func()
}

var errWriteTooLarge = errors.New("kite: message exceeds the maximum frame size")

func (s *objectStream) WriteObject(obj any) error {
	var b []byte
	var err error
	if m, ok := obj.(json.Marshaler); ok {
		b, err = m.MarshalJSON() // jsonrpc2's messages: skip encoding/json's re-validation and compaction
	} else {
		b, err = json.Marshal(obj)
	}
	if err != nil {
		return fmt.Errorf("kite: encode message: %w", err)
	}
	if int64(len(b)) > s.maxFrame {
		return errWriteTooLarge
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.wtimeout)
	defer cancel()
	return s.frames.WriteFrame(ctx, b)
}

func (s *objectStream) ReadObject(v any) (err error) {
	defer func() {
		if err != nil && s.onReadErr != nil {
			s.onReadErr()
		}
	}()
	for {
		// No cancellation on the read: Conn.Close closes the frames, which ends a blocked read, and a
		// ctx with a Done channel costs coder/websocket a context.AfterFunc on every read.
		b, err := s.frames.ReadFrame(context.WithoutCancel(s.ctx))
		if err != nil {
			return err
		}
		id, code, msg := screen(b)
		if code == 0 {
			return json.Unmarshal(b, v)
		}
		if code == dropFrame {
			continue // a broken response: answering it could start an error ping-pong
		}
		if id == nil {
			id = json.RawMessage("null")
		}
		reply, _ := json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   *jsonrpc2.Error `json:"error"`
		}{"2.0", id, ToWire(fmt.Errorf("%s: %w", msg, codeErr(code)))})
		ctx, cancel := context.WithTimeout(s.ctx, s.wtimeout)
		err = s.frames.WriteFrame(ctx, reply)
		cancel()
		if err != nil {
			return err
		}
	}
}

func (s *objectStream) Close() error { return s.frames.Close(frame.CloseNormal, "") }

// dropFrame marks a frame that is dropped without an answer.
const dropFrame = 1

func codeErr(code int64) error {
	if code == CodeParse {
		return ErrParse
	}
	return ErrInvalidRequest
}

// screen checks one frame. It returns code 0 if jsonrpc2 can take it; otherwise the id to answer
// (if it could be read), the error code and a message.
func screen(b []byte) (id json.RawMessage, code int64, msg string) {
	if bytes.Equal(b, frame.Binary) {
		return nil, CodeInvalidRequest, "binary frames are not part of the kite protocol"
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, CodeInvalidRequest, "empty frame"
	}
	if b[0] != '{' && !json.Valid(b) { // objects are checked while decoding below
		return nil, CodeParse, "frame is not valid JSON"
	}
	if b[0] == '[' {
		return nil, CodeInvalidRequest, "batch requests are not supported: send one object per frame"
	}
	if b[0] != '{' {
		return nil, CodeInvalidRequest, "a frame must hold one JSON-RPC 2.0 object"
	}
	var m struct {
		JSONRPC *string         `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  *string         `json:"method"`
		Params  json.RawMessage `json:"params"`
		Result  json.RawMessage `json:"result"`
		Error   json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, CodeParse, "frame is not valid JSON"
		}
		return nil, CodeInvalidRequest, "malformed JSON-RPC object: " + err.Error()
	}
	isResponse := m.Method == nil && (m.Result != nil || m.Error != nil)
	defer func() {
		if code != 0 && isResponse {
			code = dropFrame
		}
	}()
	if len(m.ID) > 0 {
		switch m.ID[0] {
		case '"', 'n':
			id = m.ID
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			if n, err := strconv.ParseInt(string(m.ID), 10, 64); err != nil || n < 0 {
				return nil, CodeInvalidRequest, "a numeric id must be a non-negative integer below 2^63"
			}
			id = m.ID
		default:
			return nil, CodeInvalidRequest, "id must be a string, a number or null"
		}
	}
	switch {
	case m.JSONRPC == nil || *m.JSONRPC != "2.0":
		return id, CodeInvalidRequest, `"jsonrpc" must be "2.0"`
	case m.Method != nil && (m.Result != nil || m.Error != nil):
		return id, CodeInvalidRequest, "a message is either a request or a response"
	case m.Method == nil && m.Result == nil && m.Error == nil:
		return id, CodeInvalidRequest, "a message needs a method, a result or an error"
	case m.Method != nil && *m.Method == "":
		return id, CodeInvalidRequest, "method is empty"
	case m.Method != nil && len(m.Params) > 0 && m.Params[0] != '{' && m.Params[0] != '[' && string(m.Params) != "null":
		return id, CodeInvalidRequest, "params must be an object or an array"
	case m.Method == nil && len(m.ID) == 0:
		return nil, CodeInvalidRequest, "a response needs an id"
	}
	// What else jsonrpc2's own types would reject: an error that is not a JSON-RPC error object.
	if len(m.Error) > 0 && string(m.Error) != "null" {
		var e jsonrpc2.Error
		if err := json.Unmarshal(m.Error, &e); err != nil {
			return id, CodeInvalidRequest, "malformed response: " + err.Error()
		}
	}
	return nil, 0, ""
}
