package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// modelsTimeout bounds one GET /models.
const modelsTimeout = 5 * time.Second

// FetchModels asks the server for its models (GET BaseURL + "/models", the
// OpenAI list shape {"data": [{"id": ...}]}): how a route configured with a
// base URL and no model (vLLM, Ollama, llama.cpp, LM Studio) learns what it
// serves. It implements provider.ModelFetcher.
func (a *Adapter) FetchModels(ctx context.Context) ([]provider.Model, error) {
	ctx, cancel := context.WithTimeout(ctx, modelsTimeout)
	defer cancel()
	u := strings.TrimRight(a.cfg.BaseURL, "/") + "/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: GET %s: %w", a.cfg.Route, u, err)
	}
	if a.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+a.cfg.APIKey)
	}
	if a.client.UserAgent != "" {
		req.Header.Set("User-Agent", a.client.UserAgent)
	}
	hc := a.client.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: GET %s: %s", a.cfg.Route, u, provider.Redact(err.Error(), a.client.Secrets...))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: GET %s: reading the answer: %w", a.cfg.Route, u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: GET %s: HTTP %d", a.cfg.Route, u, resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("%s: GET %s: not an OpenAI model list: %w", a.cfg.Route, u, err)
	}
	out := make([]provider.Model, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID != "" {
			out = append(out, provider.Model{ID: m.ID})
		}
	}
	return out, nil
}
