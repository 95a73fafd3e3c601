package userdata

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"gopkg.in/yaml.v3"
)

// decodeCloudConfig parses a #cloud-config document the way cloud-init (PyYAML, YAML 1.1) reads
// it, as far as it matters for cloud-config: unquoted yes/no/on/off (any of the three casings)
// are booleans, timestamps stay strings, octal 0755 is an integer. The top level must be a map
// (or empty).
func decodeCloudConfig(doc []byte) (map[string]any, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(doc))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, fmt.Errorf("parse #cloud-config: %w: %w", ErrInvalid, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fmt.Errorf("parse #cloud-config: more than one YAML document: %w", ErrInvalid)
	}
	if len(root.Content) == 0 {
		return nil, nil
	}
	top := root.Content[0]
	if top.Kind == yaml.ScalarNode && top.Tag == "!!null" {
		return nil, nil
	}
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("parse #cloud-config: the top level must be a map of keys: %w", ErrInvalid)
	}
	yaml11(top, false)
	var v any
	if err := top.Decode(&v); err != nil {
		return nil, fmt.Errorf("parse #cloud-config: %w: %w", ErrInvalid, err)
	}
	n, err := normalize(v, "")
	if err != nil {
		return nil, fmt.Errorf("parse #cloud-config: %w", err)
	}
	m, _ := n.(map[string]any)
	return m, nil
}

// yaml11 retags plain scalars that YAML 1.1 resolves differently from yaml.v3's decoding into
// interface values. Mapping keys are left alone (cloud-config keys are strings).
func yaml11(n *yaml.Node, isKey bool) {
	switch n.Kind {
	case yaml.ScalarNode:
		if isKey || n.Style != 0 {
			return
		}
		switch n.Tag {
		case "!!str":
			switch n.Value {
			case "yes", "Yes", "YES", "on", "On", "ON":
				n.Tag, n.Value = "!!bool", "true"
			case "no", "No", "NO", "off", "Off", "OFF":
				n.Tag, n.Value = "!!bool", "false"
			}
		case "!!timestamp":
			n.Tag = "!!str"
		}
	case yaml.MappingNode:
		for i, c := range n.Content {
			yaml11(c, i%2 == 0)
		}
	case yaml.SequenceNode, yaml.DocumentNode:
		for _, c := range n.Content {
			yaml11(c, false)
		}
	}
}

// encodeCloudConfig renders cfg as "#cloud-config\n" plus YAML: two-space indent, map keys
// sorted, multi-line strings as literal blocks.
func encodeCloudConfig(cfg map[string]any) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("#cloud-config\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(cfg); err != nil {
		return nil, fmt.Errorf("encode cloud-config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode cloud-config: %w", err)
	}
	return b.Bytes(), nil
}
