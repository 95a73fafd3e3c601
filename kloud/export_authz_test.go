package kloud

// HTTPRoute is one HTTP route of the table and who may use it (for the authorization matrix,
// authzmatrix_test.go).
type HTTPRoute struct{ Pattern, Who string }

// HTTPRoutes returns the HTTP route table.
func (s *Server) HTTPRoutes() []HTTPRoute {
	var out []HTTPRoute
	for _, r := range s.httpRoutes() {
		out = append(out, HTTPRoute{r.pattern, r.who})
	}
	return out
}
