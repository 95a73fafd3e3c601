package kontrol_test

import "encoding/base64"

func decodeSegment(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
