"""Built-in policies, one module each. The policy registry imports every module of this
package the first time a policy name is looked up, so a new built-in is one new file."""
