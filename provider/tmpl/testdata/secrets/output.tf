output "key" {
  sensitive = true
  value   = var.aws_access_key
}
