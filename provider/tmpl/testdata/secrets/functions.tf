resource "aws_instance" "web" {
  user_data = templatefile("init.tftpl", { key = var.aws_secret_key })
  tags      = { for k in [var.aws_access_key] : k => k }
  ami       = "%{if var.aws_secret_key != ""}x%{endif}"
}
