check "c" {
  assert {
    condition     = var.aws_secret_key != ""
    error_message = "x"
  }
}
