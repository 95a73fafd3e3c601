package kloud

// TerraformerForTest returns the terraformer kloud uses, so a test can wrap it.
func (s *Server) TerraformerForTest() (Terraformer, error) { return s.terraformer() }
