import {
  id = var.aws_secret_key
  to = aws_instance.web
}
