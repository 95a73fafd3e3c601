variable "copy" {
  default = var.aws_secret_key
}
