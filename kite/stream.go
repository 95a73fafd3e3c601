package kite

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/kloud-dev/kloud/kite/frame"
)

// The wire format, read and written by the connection itself (docs/ARCHITECTURE.md §2): every
// incoming frame is decoded once, into message, whose params, result and error stay raw until
// the handler (Request.Bind) or the caller (Conn.Call) decodes them into their own types; every
// outgoing frame is encoded once, into a pooled buffer. sourcegraph/jsonrpc2 supplies the types
// that cross this boundary (jsonrpc2.ID, jsonrpc2.Error and its codes): its Conn decoded each
// frame two or three more times and re-encoded every reply (bench/RESULTS.md, "Spine").

// message is one decoded frame: a request (Method set), a notification (a request without id or
// with id null) or a response (Result or Error set).
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  *string         `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

// dropFrame marks a frame that is dropped without an answer.
const dropFrame = 1

var errWriteTooLarge = errors.New("kite: message exceeds the maximum frame size")

func codeErr(code int64) error {
	if code == CodeParse {
		return ErrParse
	}
	return ErrInvalidRequest
}

// parse decodes one frame into m, checking what jsonrpc2's conformance pins: malformed JSON is
// -32700, a frame that is not a JSON-RPC 2.0 request or response -32600 (answered with the id
// when it could be read; a broken response is dropped, code dropFrame: answering it could start
// an error ping-pong). Code 0: m is a well-formed request or response. The frame may be reused
// once parse returns: m holds copies.
func parse(b []byte, m *message) (id json.RawMessage, code int64, msg string) {
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
	if err := json.Unmarshal(b, m); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, CodeParse, "frame is not valid JSON"
		}
		return nil, CodeInvalidRequest, "malformed JSON-RPC object: " + err.Error()
	}
	// A JSON null reaches a RawMessage as "null": present-but-null stays apart from absent.
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
	case m.JSONRPC != "2.0":
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
	return nil, 0, ""
}

// parseID reads a validated id (parse checked its form) as jsonrpc2 does: a string, or a
// number below 2^63. ok is false for an absent or null id (a notification).
func parseID(raw json.RawMessage) (id jsonrpc2.ID, ok bool) {
	if len(raw) == 0 || raw[0] == 'n' {
		return id, false
	}
	if raw[0] == '"' {
		if s, simple := unquoteSimple(raw); simple {
			return jsonrpc2.ID{Str: s, IsString: true}, true
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return id, false
		}
		return jsonrpc2.ID{Str: s, IsString: true}, true
	}
	n, err := strconv.ParseUint(string(raw), 10, 63)
	if err != nil {
		return id, false
	}
	return jsonrpc2.ID{Num: n}, true
}

// unquoteSimple unquotes a JSON string without escapes.
func unquoteSimple(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') >= 0 {
		return "", false
	}
	return string(in), true
}

// decodeError reads a response's error object into a jsonrpc2.Error.
func decodeError(raw json.RawMessage) (*jsonrpc2.Error, error) {
	var e jsonrpc2.Error
	if err := json.Unmarshal(raw, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// wbuf is a pooled buffer an outgoing frame is encoded into, with the json.Encoder that writes
// into it (an encoder per buffer: making one per frame would cost an allocation).
type wbuf struct {
	b   bytes.Buffer
	enc *json.Encoder
}

var wbufs = sync.Pool{New: func() any {
	w := &wbuf{}
	w.enc = json.NewEncoder(&w.b)
	return w
}}

// maxPooled is the largest buffer returned to the pool: one large result must not pin its
// buffer for ever.
const maxPooled = 64 << 10

func getBuf() *wbuf {
	w := wbufs.Get().(*wbuf)
	w.b.Reset()
	return w
}

func putBuf(w *wbuf) {
	if w.b.Cap() <= maxPooled {
		wbufs.Put(w)
	}
}

// value encodes v as encoding/json.Marshal would (HTML-escaped, compact), once.
func (w *wbuf) value(v any) error {
	if v == nil {
		w.b.WriteString("null")
		return nil
	}
	if err := w.enc.Encode(v); err != nil {
		return err
	}
	w.b.Truncate(w.b.Len() - 1) // Encode's newline
	return nil
}

// str writes s as a JSON string (as json.Marshal would).
func (w *wbuf) str(s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			w.enc.Encode(s)
			w.b.Truncate(w.b.Len() - 1)
			return
		}
	}
	w.b.WriteByte('"')
	w.b.WriteString(s)
	w.b.WriteByte('"')
}

// request encodes a call (id > 0) or a notification (id 0).
func (w *wbuf) request(id uint64, method string, params any) error {
	w.b.WriteString(`{"jsonrpc":"2.0",`)
	if id > 0 {
		w.b.WriteString(`"id":`)
		w.b.Write(strconv.AppendUint(w.b.AvailableBuffer(), id, 10))
		w.b.WriteByte(',')
	}
	w.b.WriteString(`"method":`)
	w.str(method)
	if params != nil {
		w.b.WriteString(`,"params":`)
		if err := w.value(params); err != nil {
			return err
		}
	}
	w.b.WriteByte('}')
	return nil
}

// result encodes a successful response.
func (w *wbuf) result(id json.RawMessage, res any) error {
	w.b.WriteString(`{"jsonrpc":"2.0","id":`)
	w.b.Write(id)
	w.b.WriteString(`,"result":`)
	if err := w.value(res); err != nil {
		return err
	}
	w.b.WriteByte('}')
	return nil
}

// error encodes an error response.
func (w *wbuf) error(id json.RawMessage, e *jsonrpc2.Error) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	w.b.WriteString(`{"jsonrpc":"2.0","id":`)
	w.b.Write(id)
	w.b.WriteString(`,"error":`)
	if err := w.value(e); err != nil {
		w.b.WriteString(`{"code":-32603,"message":"internal error: the error could not be encoded"}`)
	}
	w.b.WriteByte('}')
}

// parseCancelID reads the id kite.cancel names, as jsonrpc2.ID.UnmarshalJSON does (a number
// or a string), into the key of the call it cancels.
func parseCancelID(raw json.RawMessage) (jsonrpc2.ID, bool) {
	var id jsonrpc2.ID
	if id.UnmarshalJSON(raw) != nil {
		return id, false
	}
	return id, true
}
