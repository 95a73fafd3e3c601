resource "aws_instance" "a" {
  count = length(var.aws_secret_key)
}
resource "aws_instance" "b" {
  for_each = toset([var.aws_access_key])
}
