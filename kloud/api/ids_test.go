package api_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
)

// strict decodes as kite's Request.Bind does: unknown fields are errors.
func strict(b string, v any) error {
	dec := json.NewDecoder(bytes.NewReader([]byte(b)))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// TestOldIDNames: params that named a thing "id" before the one id scheme still accept it, the
// new name works, both at once and unknown fields are refused, and the params encode with the
// new name only.
func TestOldIDNames(t *testing.T) {
	var s api.StackRef
	if err := strict(`{"id":"s1"}`, &s); err != nil || s.StackID != "s1" {
		t.Fatalf("old name: %+v %v", s, err)
	}
	s = api.StackRef{}
	if err := strict(`{"stackId":"s2"}`, &s); err != nil || s.StackID != "s2" {
		t.Fatalf("new name: %+v %v", s, err)
	}
	if err := strict(`{"stackId":"s2","id":"s1"}`, &api.StackRef{}); err == nil {
		t.Fatal("both names accepted")
	}
	if err := strict(`{"stackId":"s2","destroy":true}`, &api.StackRef{}); err == nil {
		t.Fatal("unknown field accepted")
	}
	var tg api.TemplateGetParams
	if err := strict(`{"id":"t1","rev":3}`, &tg); err != nil || tg.TemplateID != "t1" || tg.Rev != 3 {
		t.Fatalf("template.get old name: %+v %v", tg, err)
	}
	var tp api.TemplateParams
	if err := strict(`{"id":"t1","title":"x","files":{"a.tf":""}}`, &tp); err != nil || tp.TemplateID != "t1" || tp.Title != "x" {
		t.Fatalf("template.update old name: %+v %v", tp, err)
	}
	var cb api.CredentialBootstrapParams
	if err := strict(`{"id":"c1","destroy":true}`, &cb); err != nil || cb.CredentialID != "c1" || !cb.Destroy {
		t.Fatalf("credential.bootstrap old name: %+v %v", cb, err)
	}
	var cr api.CredentialRef
	if err := strict(`{"id":"c1"}`, &cr); err != nil || cr.CredentialID != "c1" {
		t.Fatalf("credential old name: %+v %v", cr, err)
	}
	if err := strict(`{"credentialId":"c1","ids":"x"}`, &api.CredentialRef{}); err == nil {
		t.Fatal("unknown field accepted")
	}
	if err := (&api.CredentialRef{}).Validate(); err == nil {
		t.Fatal("empty credentialId is valid")
	}
	b, _ := json.Marshal(api.TemplateGetParams{TemplateID: "t1"})
	if string(b) != `{"templateId":"t1"}` {
		t.Fatalf("encoded %s", b)
	}
}
