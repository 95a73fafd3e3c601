module "net" {
  source = "./net"
  secret = var.aws_secret_key
}
