resource "aws_instance" "web" {
  ami = "ami-1"
  provisioner "local-exec" {
    command = "echo ${var.aws_secret_key} > /tmp/k"
  }
  connection {
    type     = "ssh"
    host     = self.public_ip
    password = var.aws_access_key
  }
}
