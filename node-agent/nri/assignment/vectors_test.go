package assignment

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// vectorsFile is shared with the Python decoder's test (tests/unit/test_assignment_vectors.py).
var vectorsFile = filepath.Join("..", "..", "..", "tests", "fixtures", "assignment-vectors.json")

type vectorDocument struct {
	Contract struct {
		Annotation           string   `json:"annotation"`
		SupportedVersions    []int64  `json:"supportedVersions"`
		MaxBytes             int      `json:"maxBytes"`
		ForbiddenEnvPrefixes []string `json:"forbiddenEnvPrefixes"`
		ForbiddenEnvNames    []string `json:"forbiddenEnvNames"`
	} `json:"contract"`
	Vectors []struct {
		Name  string   `json:"name"`
		Value string   `json:"value"`
		Error []string `json:"error"`
		PadTo int      `json:"padTo"`
	} `json:"vectors"`
}

func loadVectors(t *testing.T) vectorDocument {
	t.Helper()
	raw, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatalf("shared vectors: %v", err)
	}
	var doc vectorDocument
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("shared vectors: %v", err)
	}
	return doc
}

func TestContractConstantsMatchPython(t *testing.T) {
	c := loadVectors(t).Contract
	if c.Annotation != Annotation || c.MaxBytes != MaxBytes {
		t.Fatalf("annotation/maxBytes drifted: %q %d", c.Annotation, c.MaxBytes)
	}
	if len(c.SupportedVersions) != len(SupportedVersions) {
		t.Fatalf("supported versions drifted: %v vs %v", c.SupportedVersions, SupportedVersions)
	}
	for i, v := range c.SupportedVersions {
		if SupportedVersions[i] != v {
			t.Fatalf("supported versions drifted: %v vs %v", c.SupportedVersions, SupportedVersions)
		}
	}
}

func TestSharedVectors(t *testing.T) {
	doc := loadVectors(t)
	if len(doc.Vectors) < 60 {
		t.Fatalf("only %d vectors", len(doc.Vectors))
	}
	for _, v := range doc.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			value := v.Value
			if v.PadTo > 0 {
				value += strings.Repeat(" ", v.PadTo-len(value))
			}
			a, err := Decode([]byte(value))
			if v.Error == nil {
				if err != nil {
					t.Fatalf("Python decodes it, Go refuses: %v", err)
				}
				if a.Version != SchemaVersion || len(a.Order) != len(a.Containers) {
					t.Fatalf("decoded badly: %+v", a)
				}
				return
			}
			if err == nil {
				t.Fatalf("Python refuses it (%q), Go decodes it", v.Error)
			}
			var decodeErr *Error
			if !errors.As(err, &decodeErr) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			for _, fragment := range v.Error {
				if !strings.Contains(err.Error(), fragment) {
					t.Fatalf("message differs from Python's:\n go:     %s\n python: %s", err, fragment)
				}
			}
		})
	}
}
